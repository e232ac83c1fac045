"""The same architectures built from torch.nn (nn.Linear, nn.LayerNorm, nn.RMSNorm, nn.Embedding,
F.scaled_dot_product_attention), with kcourse.modules' parameter names, so one state dict loads
into both. Written independently of kcourse: the second oracle of the module tests."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Not cuDNN: its bfloat16 backward gave wrong gradients on an H100 with torch 2.11 (pytorch#196678).
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate-half rotary embedding of x (..., T, D), computed in float32."""
    T, D = x.shape[-2:]
    inv_freq = base ** (-torch.arange(0, D // 2, dtype=torch.float32, device=x.device) * 2 / D)  # (D/2,)
    angle = torch.arange(T, dtype=torch.float32, device=x.device)[:, None] * inv_freq  # (T, D/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim, n_head, n_kv_head=None, causal=True, rope=False, bias=False):
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head or n_head
        self.head_dim, self.causal, self.rope = dim // n_head, causal, rope
        self.c_attn = nn.Linear(dim, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x):
        B, T, _ = x.shape
        hd, kv = self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([self.n_head * hd, kv, kv], dim=-1)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, hd).transpose(1, 2)
        if self.rope:
            q, k = rope(q), rope(k)
        with sdpa_kernel(SDPA_BACKENDS):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, dim, hidden, bias=True):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(dim, hidden, bias=bias), nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden, bias=False):
        super().__init__()
        self.w_gate, self.w_up = nn.Linear(dim, hidden, bias=bias), nn.Linear(dim, hidden, bias=bias)
        self.w_down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def norm(c):
    return nn.LayerNorm(c.n_embd, bias=c.bias) if c.norm == "layernorm" else nn.RMSNorm(c.n_embd, eps=1e-6)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.ln_2 = norm(c), norm(c)
        self.attn = Attention(c.n_embd, c.n_head, c.n_kv_head, True, c.pos == "rope", c.bias)
        hidden = c.mlp_hidden or 4 * c.n_embd
        self.mlp = MLP(c.n_embd, hidden, c.bias) if c.mlp == "gelu" else SwiGLU(c.n_embd, hidden, c.bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd) if c.pos == "learned" else None
        self.h = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = norm(c)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets=None):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss
