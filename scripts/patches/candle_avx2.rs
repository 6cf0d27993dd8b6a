// seeker's AVX2 kernels for candle-core 0.11.1's repacked Q4K and Q6K tiles, for CPUs with
// AVX2 and FMA but neither AVX-512 VNNI nor AVX-VNNI (scripts/patch-candle.sh includes this
// file into `quantized/repack_x86.rs`'s `kernels256` module, in place of the two kernels that
// candle builds there from its `dp_avx2` step).
//
// candle's AVX2 step stands in for `vpdpbusd` by widening every `maddubs` result (u8 x i8
// products, adjacent pairs summed into i16) to i32 with a `madd` against ones and an add: three
// instructions a product. Here products are summed in i16 for as long as they cannot overflow
// it and widened once. The integer sums are the same, so the results are bit-identical to
// candle's (bench/README.md, "AVX2 kernels", checked the greedy text once), and a Q4K
// sub-block costs about a third fewer integer instructions (Q6K, with pairs only, a sixth). Tile layout (`TileQ4K`, `TileQ6K`: 16 weight rows, 4
// bytes a row a group, rows 0-7 then 8-15 in the two 32-byte halves) and `BlockQ8K`
// activations are candle's.

// Q4K on AVX2 without VNNI: `maddubs` (u8 x i8 -> i16, adjacent pairs summed) gives at
// most 2 * 15 * 128 = 3,840 in magnitude a lane, so a sub-block's 8 products (4 groups x
// low and high nibbles) sum in i16 (at most 30,720) before one `madd` widens them to i32,
// instead of widening every product. Each weight group is loaded once for both halves of
// the tile and each activation broadcast once for both.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn q4k_tile_avx2(tile: &TileQ4K, acts: &[&BlockQ8K], acc: &mut [[__m256; 2]]) {
    let mask = _mm256_set1_epi8(0x0F_u8 as i8);
    let ones = _mm256_set1_epi16(1);
    for sub in 0..8 {
        let mut isum = [[_mm256_setzero_si256(); 2]; MAX_MT];
        for g4 in 0..4 {
            let g = sub * 4 + g4;
            let base = tile.qs.as_ptr().add(g * TILE_N * 4);
            let w0 = _mm256_loadu_si256(base as *const _);
            let w1 = _mm256_loadu_si256(base.add(32) as *const _);
            let lo0 = _mm256_and_si256(w0, mask);
            let hi0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), mask);
            let lo1 = _mm256_and_si256(w1, mask);
            let hi1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), mask);
            for (m, act) in acts.iter().enumerate() {
                let a_lo = bcast4_256(&act.qs, sub * 32 + g4 * 8);
                let a_hi = bcast4_256(&act.qs, sub * 32 + g4 * 8 + 4);
                let p0 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo0, a_lo),
                    _mm256_maddubs_epi16(hi0, a_hi),
                );
                let p1 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo1, a_lo),
                    _mm256_maddubs_epi16(hi1, a_hi),
                );
                isum[m][0] = _mm256_add_epi16(isum[m][0], p0);
                isum[m][1] = _mm256_add_epi16(isum[m][1], p1);
            }
        }
        for h in 0..2 {
            let scale = _mm256_loadu_ps(tile.scales[sub].as_ptr().add(h * 8));
            let min = _mm256_loadu_ps(tile.mins[sub].as_ptr().add(h * 8));
            for (m, act) in acts.iter().enumerate() {
                let dall = act.d;
                let f = _mm256_cvtepi32_ps(_mm256_madd_epi16(isum[m][h], ones));
                acc[m][h] =
                    _mm256_fmadd_ps(f, _mm256_mul_ps(scale, _mm256_set1_ps(dall)), acc[m][h]);
                let bsum = (act.bsums[sub * 2] as i32 + act.bsums[sub * 2 + 1] as i32) as f32;
                acc[m][h] = _mm256_fnmadd_ps(min, _mm256_set1_ps(dall * bsum), acc[m][h]);
            }
        }
    }
}

// Q6K on AVX2 without VNNI: weights are 0..63, so a `maddubs` lane is at most
// 2 * 63 * 128 = 16,128 in magnitude and two of them (32,256) still fit i16: products
// are summed in pairs before each `madd`, and each weight group is loaded once for both
// halves of the tile.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn q6k_tile_avx2(tile: &TileQ6K, acts: &[&BlockQ8K], acc: &mut [[__m256; 2]]) {
    let ones = _mm256_set1_epi16(1);
    for sub in 0..16 {
        let mut isum = [[_mm256_setzero_si256(); 2]; MAX_MT];
        for pair in 0..2 {
            let g = sub * 4 + pair * 2;
            let base = tile.qs.as_ptr().add(g * TILE_N * 4);
            let w00 = _mm256_loadu_si256(base as *const _);
            let w01 = _mm256_loadu_si256(base.add(32) as *const _);
            let w10 = _mm256_loadu_si256(base.add(TILE_N * 4) as *const _);
            let w11 = _mm256_loadu_si256(base.add(TILE_N * 4 + 32) as *const _);
            for (m, act) in acts.iter().enumerate() {
                let a0 = bcast4_256(&act.qs, sub * 16 + pair * 8);
                let a1 = bcast4_256(&act.qs, sub * 16 + pair * 8 + 4);
                let p0 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(w00, a0), _mm256_maddubs_epi16(w10, a1));
                let p1 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(w01, a0), _mm256_maddubs_epi16(w11, a1));
                isum[m][0] = _mm256_add_epi32(isum[m][0], _mm256_madd_epi16(p0, ones));
                isum[m][1] = _mm256_add_epi32(isum[m][1], _mm256_madd_epi16(p1, ones));
            }
        }
        for h in 0..2 {
            let scale = _mm256_loadu_ps(tile.scales[sub].as_ptr().add(h * 8));
            for (m, act) in acts.iter().enumerate() {
                let dall = act.d;
                let bsum = act.bsums[sub] as f32;
                let f = _mm256_sub_ps(_mm256_cvtepi32_ps(isum[m][h]), _mm256_set1_ps(32.0 * bsum));
                acc[m][h] =
                    _mm256_fmadd_ps(f, _mm256_mul_ps(scale, _mm256_set1_ps(dall)), acc[m][h]);
            }
        }
    }
}
