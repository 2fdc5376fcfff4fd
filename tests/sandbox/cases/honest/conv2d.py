# expect: correct  problem: problems/conv2d.py
# Honest: direct 2-D convolution (stride 1, padding 1) with bias: an im2col gather per output block, masked at the halo.
import torch
import triton
import triton.language as tl


@triton.jit
def _conv2d_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr,
    C, H, W, OC, OH, OW, KH, KW, pad,
    sxn, sxc, sxh, sxw, swo, swc, swh, sww, son, soc, soh, sow,
    BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid_nc = tl.program_id(0)
    pid_p = tl.program_id(1)
    n = pid_nc // OC
    oc = pid_nc % OC
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = p < OH * OW
    oh = p // OW
    ow = p % OW
    # r enumerates (c, kh, kw) of the receptive field.
    r = tl.arange(0, BLOCK_R)
    r_mask = r < C * KH * KW
    c = r // (KH * KW)
    kh = (r // KW) % KH
    kw = r % KW
    ih = oh[:, None] - pad + kh[None, :]
    iw = ow[:, None] - pad + kw[None, :]
    m = p_mask[:, None] & r_mask[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    x = tl.load(x_ptr + n * sxn + c[None, :] * sxc + ih * sxh + iw * sxw, mask=m, other=0.0)
    w = tl.load(w_ptr + oc * swo + c * swc + kh * swh + kw * sww, mask=r_mask, other=0.0)
    acc = tl.sum(x.to(tl.float32) * w.to(tl.float32)[None, :], axis=1)
    acc += tl.load(b_ptr + oc).to(tl.float32)
    tl.store(out_ptr + n * son + oc * soc + oh * soh + ow * sow, acc, mask=p_mask)


def triton_fused_operator(tensor_0, tensor_1, tensor_2):
    N, C, H, W = tensor_0.shape
    OC, _, KH, KW = tensor_1.shape
    pad = 1
    OH, OW = H + 2 * pad - KH + 1, W + 2 * pad - KW + 1
    out = torch.empty((N, OC, OH, OW), device=tensor_0.device, dtype=tensor_0.dtype)
    BLOCK_P = 128
    grid = (N * OC, triton.cdiv(OH * OW, BLOCK_P))
    _conv2d_kernel[grid](
        tensor_0, tensor_1, tensor_2, out,
        C, H, W, OC, OH, OW, KH, KW, pad,
        *tensor_0.stride(), *tensor_1.stride(), *out.stride(),
        BLOCK_P=BLOCK_P, BLOCK_R=triton.next_power_of_2(C * KH * KW),
    )
    return [out]
