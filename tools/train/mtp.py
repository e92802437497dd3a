"""The Qwen3.5 multi-token-prediction head (spec/qwen35.md section 5), built from transformers' own modules.

    e  = embed_tokens[x_{t+1}]                        (shared embedding)
    hh = main model's hidden at t after the final norm (the lm_head input)
    u  = [rmsnorm1p(e, pre_fc_norm_embedding), rmsnorm1p(hh, pre_fc_norm_hidden)] . fc      embedding FIRST
    u  = one full-attention Qwen3_5DecoderLayer (gated attention + dense MLP), RoPE position t, causal over
         the head's own earlier rows
    logits(x_{t+2}) = rmsnorm1p(u, mtp.norm) . lm_head (tied: embed_tokens)

Parameter names under this module are exactly the checkpoint's names after the "mtp." prefix:
fc.weight, pre_fc_norm_embedding.weight, pre_fc_norm_hidden.weight, norm.weight, layers.0.* .
"""

import torch
from torch import nn


class MTPHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        H = config.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)  # [H, 2H]
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=config.rms_norm_eps)  # [H] zero-centred
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=config.rms_norm_eps)  # [H] zero-centred
        # A decoder layer built for the index of a full-attention layer is a full-attention layer; the
        # index only names its (unused) cache slot.
        full_idx = list(config.layer_types).index("full_attention")
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, full_idx)])
        self.norm = Qwen3_5RMSNorm(H, eps=config.rms_norm_eps)  # [H] zero-centred

    def init_weights(self, std, generator=None):
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std, generator=generator)
                else:
                    p.zero_()  # zero-centred norms: (1 + 0) = identity


def causal_mask(T, dtype, device):
    """Additive [1, 1, T, T] mask for the eager attention path (sdpa gets None and is_causal)."""
    m = torch.full((T, T), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return m[None, None]


def mtp_logits(head, model, ids, hidden, explicit_mask=False):
    """MTP logits [B, T-1, V]: row t predicts x_{t+2} from (x_{t+1}, hidden_t) at RoPE position t.

    model: Qwen3_5ForCausalLM (shared embed_tokens, rotary_emb, lm_head); ids [B, T] long;
    hidden [B, T, H] the main model's final-normed hidden states."""
    emb = model.model.embed_tokens(ids[:, 1:])
    u = head.fc(torch.cat([head.pre_fc_norm_embedding(emb), head.pre_fc_norm_hidden(hidden[:, :-1])], dim=-1))
    B, T1 = u.shape[0], u.shape[1]
    pos = torch.arange(T1, device=u.device)
    # Qwen3.5's rotary takes [3, B, T] (t/h/w rows of mRoPE; all equal for text)
    cos, sin = model.model.rotary_emb(emb, pos.view(1, 1, -1).expand(3, B, -1))
    mask = causal_mask(T1, u.dtype, u.device) if explicit_mask else None
    u = head.layers[0](u, position_embeddings=(cos, sin), attention_mask=mask,
                       position_ids=pos.view(1, -1).expand(B, -1))
    return model.lm_head(head.norm(u))
