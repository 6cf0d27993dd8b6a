//! seeker's CPU attention for mistral.rs 0.8.1 (scripts/patch-candle.sh copies this file into
//! the patched mistralrs-core as `src/attention/seeker_cpu.rs`; docs/kernels.md says why).
//!
//! mistral.rs 0.8.1 sends every CPU attention to its flash kernel, a scalar loop per query
//! row, and its matmul path (`naive_sdpa`) first repeats K and V for every query head of a
//! group. Here the query heads that share a key/value head are stacked as rows of one matrix
//! (Qwen2.5-1.5B: 12 query heads over 2 key/value heads, so 6 rows a token), and each group
//! is two batched matmuls (candle's gemm) with the mask and a softmax between them: no copy
//! of the cache, and the same kernels for a prompt of many rows and a decode step of one, so
//! a prompt that reuses cached rows matches a full prefill up to rounding (1e-4 on the
//! next-token log-probs of the F32 small model: tests/it/reuse.rs).

use candle_core::{DType, Result, Tensor};

use super::SdpaParams;

/// Query rows (tokens) a chunk: bounds each score-sized buffer (scores, masked scores,
/// probabilities; two or three live at once) at `n_heads × ROWS × keys × 4` bytes a sequence
/// (12 × 256 × 4,096 × 4 = 48 MiB for the default model at 4k tokens).
const ROWS: usize = 256;

/// Attention over grouped heads. `q`: (batch, n_heads, q_len, head_dim); `k`, `v`: (batch,
/// n_kv_heads, kv_len, head_dim); `mask`: additive, (q_len, kv_len), (batch, q_len, kv_len) or
/// (batch, 1, q_len, kv_len). Returns (batch, n_heads, q_len, head_dim), or `None` for what
/// this does not handle, which the caller sends to mistral.rs's own kernels: activations other
/// than F32 (mistral.rs's flash loop computes in F32 whatever the activations; a 16-bit
/// softmax sum over thousands of keys would not), softcapping, other mask shapes.
pub(crate) fn grouped_sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    sdpa_params: &SdpaParams,
) -> Result<Option<Tensor>> {
    if q.dtype() != DType::F32 || sdpa_params.softcap.is_some() {
        return Ok(None);
    }
    let (b, n_heads, s, d) = q.dims4()?;
    let (kb, n_kv, sk, kd) = k.dims4()?;
    let (vb, vn, vsk, dv) = v.dims4()?;
    if kb != b || vb != b || vn != n_kv || vsk != sk || kd != d || n_kv == 0 || n_heads % n_kv != 0
    {
        return Ok(None);
    }
    let n_rep = n_heads / n_kv;
    // The mask as (batch or 1, 1, 1, q_len, kv_len): it broadcasts over groups and heads.
    let mask = match mask {
        None => None,
        Some(m) => {
            let m = match *m.dims() {
                [ms, msk] if ms == s && msk == sk => m.reshape((1, 1, 1, s, sk))?,
                [mb, ms, msk] if ms == s && msk == sk && (mb == b || mb == 1) => {
                    m.reshape((mb, 1, 1, s, sk))?
                }
                [mb, 1, ms, msk] if ms == s && msk == sk && (mb == b || mb == 1) => {
                    m.reshape((mb, 1, 1, s, sk))?
                }
                _ => return Ok(None),
            };
            Some(m.to_dtype(DType::F32)?)
        }
    };
    let scale = f64::from(sdpa_params.softmax_scale);
    let mut outs = Vec::with_capacity(s.div_ceil(ROWS));
    let mut start = 0;
    while start < s {
        let len = ROWS.min(s - start);
        let mask = match &mask {
            Some(m) => Some(m.narrow(3, start, len)?),
            None => None,
        };
        // The keys this chunk's rows can see: a causal mask hides every key after the chunk's
        // last row from all its rows. They are left out when the mask holds f32::MIN or −∞
        // for every one of them (their softmax weight is exactly 0 either way), which halves
        // a long prompt's work.
        let mut keys = sk;
        if let (Some(m), Some(visible)) = (&mask, sk.checked_sub(s - start - len)) {
            if visible < sk {
                let hidden = m.narrow(4, visible, sk - visible)?;
                let most = hidden
                    .flatten_all()?
                    .max(0)?
                    .to_scalar::<f32>()?;
                if most <= f32::MIN {
                    keys = visible;
                }
            }
        }
        // K and V as the cache holds them (a view of its buffer): candle's gemm reads the
        // strides, so nothing of the cache is copied.
        let kt = batched(&k.narrow(2, 0, keys)?)?.t()?;
        let vs = batched(&v.narrow(2, 0, keys)?)?;
        // (b, n_heads, len, d) -> (b, n_kv, n_rep * len, d): head g * n_rep + r is row block r
        // of group g, the key/value head it reads.
        let rows = (q
            .narrow(2, start, len)?
            .contiguous()?
            .reshape((b, n_kv, n_rep * len, d))?
            * scale)?;
        let mut scores = rows.matmul(&kt)?;
        if let Some(m) = &mask {
            scores = scores
                .reshape((b, n_kv, n_rep, len, keys))?
                .broadcast_add(&m.narrow(4, 0, keys)?)?
                .reshape((b, n_kv, n_rep * len, keys))?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        outs.push(probs.matmul(&vs)?.reshape((b, n_heads, len, dv))?);
        start += len;
    }
    if outs.len() == 1 {
        Ok(outs.pop())
    } else {
        Ok(Some(Tensor::cat(&outs, 2)?))
    }
}

/// `t` (4 dims) as it is where candle's CPU matmul takes its strides as they are (rows of
/// contiguous values, the two batch dimensions one run of equal steps: a view of a KV cache's
/// buffer), else a contiguous copy.
fn batched(t: &Tensor) -> Result<Tensor> {
    let (dims, stride) = (t.dims(), t.stride());
    if stride[3] == 1 && stride[0] == stride[1] * dims[1] {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}
