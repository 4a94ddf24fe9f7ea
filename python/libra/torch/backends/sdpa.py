"""The portable fallback: ``scaled_dot_product_attention`` per packed sample, on any device and float
dtype. It loops over the call's samples on the host, so it is much slower than a fused varlen kernel
(docs/python.md gives the measured ratio against libra's CPU kernel); it exists so that every device
torch runs on can run libra, and as a second independent implementation under test."""
import torch
import torch.nn.functional as F

from . import Backend


class Sdpa(Backend):
    name = "sdpa"
    kind = "varlen"

    def unavailable(self, device, dtype):
        if not dtype.is_floating_point:
            return f"takes floating-point tensors, not {dtype}"
        return None

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        cq, ck = cu_host
        ratio = q.shape[1] // k.shape[1]
        outs, lses = [], []
        for i in range(len(cq) - 1):
            qs = q[cq[i]:cq[i + 1]].transpose(0, 1)  # [h_q, s_q, d]
            ks = k[ck[i]:ck[i + 1]].transpose(0, 1)
            vs = v[ck[i]:ck[i + 1]].transpose(0, 1)
            sq, sk = qs.shape[1], ks.shape[1]
            # Bottom-right causal: query i sees keys j <= i + sk - sq, and within the window's W positions.
            pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
            j = torch.arange(sk, device=q.device)[None, :]
            mask = j <= pos
            if window is not None:
                mask &= j > pos - int(window)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=ratio > 1)
            outs.append(o.transpose(0, 1))
            with torch.no_grad():  # SDPA gives no LSE: computed on the side, never differentiated
                kk = ks.repeat_interleave(ratio, dim=0) if ratio > 1 else ks
                s = torch.matmul(qs.float(), kk.float().transpose(1, 2))
                s = s * (qs.shape[-1] ** -0.5 if scale is None else scale)
                lses.append(torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1))
        return torch.cat(outs), torch.cat(lses, dim=1)


BACKEND = Sdpa()
