//! Binary quantization with exact rescoring: the approximate dense search
//! for large corpora. Each stored vector is kept as one bit per dimension,
//! the sign of the vector minus the corpus mean (384 dimensions: 48 bytes
//! instead of 1,536); a query scans every row's code by Hamming distance to
//! its own code (XOR and popcount, 6 words a row at 384-d), keeps the
//! `rescore` rows nearest by that count, and scores only those by their
//! exact inner product. The technique is the "binary quantization +
//! rescoring" of sentence-transformers' embedding-quantization write-up
//! (Shakir, Aarsen & Lee, 2024), with the codes centred first so that an
//! anisotropic embedding space (every MiniLM vector shares a large common
//! component) still splits each dimension in half.
//!
//! It needs nothing at build time: the codes are made when the index opens
//! (about a second per million 384-d rows), from the same `vectors.f32` that
//! exact search reads. `bench/README.md` ("Dense search at scale") measures
//! it against exact search and an HNSW graph (the `hnsw_rs` crate) at 1M rows;
//! it found more of exact search's top 10, sooner, for a fraction of the
//! memory and no build time.

use super::embed::dot;

/// The sign-bit codes of a matrix of vectors, and how to search them.
pub struct SignCodes {
    dim: usize,
    /// `u64` words per row: `ceil(dim / 64)`.
    words: usize,
    /// Row `i`'s code at `codes[i * words..(i + 1) * words]`; bit `d % 64` of
    /// word `d / 64` is set when dimension `d` is above the mean.
    codes: Vec<u64>,
    /// The corpus mean, per dimension.
    mean: Vec<f32>,
}

impl SignCodes {
    /// The codes of `vectors` (`rows × dim` floats, row-major).
    pub fn new(vectors: &[f32], dim: usize) -> Self {
        let dim = dim.max(1);
        let rows = vectors.len() / dim;
        let mut sums = vec![0f64; dim];
        for row in vectors.chunks_exact(dim) {
            for (s, x) in sums.iter_mut().zip(row) {
                *s += f64::from(*x);
            }
        }
        let mean: Vec<f32> = sums
            .iter()
            .map(|s| (s / rows.max(1) as f64) as f32)
            .collect();
        let words = dim.div_ceil(64);
        let mut codes = vec![0u64; rows * words];
        for (row, code) in vectors.chunks_exact(dim).zip(codes.chunks_exact_mut(words)) {
            encode(row, &mean, code);
        }
        Self {
            dim,
            words,
            codes,
            mean,
        }
    }

    /// Rows coded.
    pub fn rows(&self) -> usize {
        self.codes.len() / self.words
    }

    /// Bytes the codes and the mean take.
    pub fn bytes(&self) -> usize {
        self.codes.len() * 8 + self.mean.len() * 4
    }

    /// The `n` rows whose codes are nearest `query`'s by Hamming distance (all
    /// rows when there are fewer), in row order; ties at the cut go to the
    /// lower rows. A query of another length gets none.
    pub fn candidates(&self, query: &[f32], n: usize) -> Vec<usize> {
        if query.len() != self.dim || n == 0 {
            return Vec::new();
        }
        let rows = self.rows();
        if n >= rows {
            return (0..rows).collect();
        }
        let mut q = vec![0u64; self.words];
        encode(query, &self.mean, &mut q);
        let (distances, histogram) = self.distances(&q);
        // Counting selection: the smallest distance `cut` with at least n
        // rows at or below it; every row below it, then rows at it in order.
        let mut below = 0;
        let mut cut = 0u16;
        for (d, &count) in histogram.iter().enumerate() {
            if below + count >= n {
                cut = d as u16;
                break;
            }
            below += count;
        }
        let mut at_cut = n - below;
        let mut out = Vec::with_capacity(n);
        for (row, &d) in distances.iter().enumerate() {
            if d < cut {
                out.push(row);
            } else if d == cut && at_cut > 0 {
                out.push(row);
                at_cut -= 1;
            }
        }
        out
    }
}

impl SignCodes {
    /// The `k` rows of `vectors` (the matrix these codes were made from) with
    /// the highest inner product with `query`, best first, with their exact
    /// inner products, among the `rescore` candidates (at least `k`) nearest
    /// by code; ties go to the lower row.
    pub fn search(
        &self,
        vectors: &[f32],
        query: &[f32],
        k: usize,
        rescore: usize,
    ) -> Vec<(usize, f32)> {
        use rayon::prelude::*;
        let scored: Vec<(usize, f32)> = self
            .candidates(query, rescore.max(k))
            .into_par_iter()
            .with_min_len(512)
            .map(|row| {
                (
                    row,
                    dot(&vectors[row * self.dim..(row + 1) * self.dim], query),
                )
            })
            .collect();
        super::embed::top_k(scored, k)
    }
}

impl SignCodes {
    /// Every row's Hamming distance to the query code `q`, and how many rows
    /// have each distance (index 0 to `64 × words`). Rows are scanned in
    /// blocks across rayon's pool.
    fn distances(&self, q: &[u64]) -> (Vec<u16>, Vec<usize>) {
        use rayon::prelude::*;
        let rows = self.rows();
        let bins = self.words * 64 + 1;
        let mut distances = vec![0u16; rows];
        let histogram = distances
            .par_chunks_mut(BLOCK)
            .zip(self.codes.par_chunks(BLOCK * self.words))
            .map(|(out, codes)| {
                match self.words {
                    6 => hamming::<6>(codes, q, out),
                    12 => hamming::<12>(codes, q, out),
                    16 => hamming::<16>(codes, q, out),
                    w => {
                        for (d, c) in out.iter_mut().zip(codes.chunks_exact(w)) {
                            *d = c
                                .iter()
                                .zip(q)
                                .map(|(a, b)| (a ^ b).count_ones())
                                .sum::<u32>() as u16;
                        }
                    }
                }
                let mut histogram = vec![0usize; bins];
                for &d in out.iter() {
                    histogram[usize::from(d)] += 1;
                }
                histogram
            })
            .reduce(
                || vec![0usize; bins],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        (distances, histogram)
    }
}

/// Rows per block of the parallel scan.
const BLOCK: usize = 1 << 16;

/// Sets bit `d` of `code` when `v[d]` is above `mean[d]`.
fn encode(v: &[f32], mean: &[f32], code: &mut [u64]) {
    code.fill(0);
    for (d, (x, m)) in v.iter().zip(mean).enumerate() {
        if x > m {
            code[d / 64] |= 1 << (d % 64);
        }
    }
}

/// Writes each row's Hamming distance to `q` into `out` (rows of `W` words;
/// the fixed width lets the compiler unroll the XOR-popcount).
fn hamming<const W: usize>(codes: &[u64], q: &[u64], out: &mut [u16]) {
    let q: [u64; W] = q.try_into().expect("query code width");
    for (d, c) in out.iter_mut().zip(codes.chunks_exact(W)) {
        let mut sum = 0u32;
        for w in 0..W {
            sum += (c[w] ^ q[w]).count_ones();
        }
        *d = sum as u16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded pseudo-random floats in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn a_stored_row_is_its_own_nearest_code_at_every_width() {
        // 100: the generic width; 384, 768, 1024: the unrolled ones.
        for dim in [100, 384, 768, 1024] {
            let v = noise(dim as u64, 300 * dim);
            let codes = SignCodes::new(&v, dim);
            assert_eq!(codes.rows(), 300);
            for row in [0, 17, 299] {
                let got = codes.candidates(&v[row * dim..(row + 1) * dim], 1);
                assert_eq!(got, vec![row], "dim {dim}, row {row}");
            }
        }
    }

    #[test]
    fn candidates_are_the_n_nearest_codes_in_row_order() {
        let dim = 64;
        // Rows differ from row 0 in exactly `i % 64` dimensions' signs.
        let base: Vec<f32> = noise(7, dim).iter().map(|x| x.signum()).collect();
        let mut v = Vec::new();
        for i in 0..200 {
            let mut row = base.clone();
            for x in row.iter_mut().take(i % 64) {
                *x = -*x;
            }
            v.extend(row);
        }
        // The mean of these rows is not zero, so query with a stored row.
        let codes = SignCodes::new(&v, dim);
        let q = &v[..dim];
        let code = |r: usize| &codes.codes[r..r + 1];
        let distance = |r: usize| (code(r)[0] ^ code(0)[0]).count_ones();
        let got = codes.candidates(q, 10);
        assert_eq!(got.len(), 10);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "row order: {got:?}");
        let worst_kept = got.iter().map(|&r| distance(r)).max().unwrap();
        let best_left = (0..200)
            .filter(|r| !got.contains(r))
            .map(distance)
            .min()
            .unwrap();
        assert!(worst_kept <= best_left, "{worst_kept} > {best_left}");
        assert_eq!(codes.candidates(q, 1_000).len(), 200, "all rows when fewer");
        assert!(codes.candidates(&q[..10], 5).is_empty(), "wrong length");
        assert!(codes.candidates(q, 0).is_empty());
    }

    #[test]
    fn search_scores_candidates_exactly_and_finds_exact_search_top_k() {
        let dim = 384;
        let rows = 2_000;
        let mut v = noise(3, rows * dim);
        for row in v.chunks_exact_mut(dim) {
            let norm = dot(row, row).sqrt();
            row.iter_mut().for_each(|x| *x /= norm);
        }
        let codes = SignCodes::new(&v, dim);
        for (seed, q) in [(11, noise(11, dim)), (12, v[5 * dim..6 * dim].to_vec())] {
            let mut exact: Vec<(usize, f32)> = v
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, r)| (i, dot(r, &q)))
                .collect();
            exact.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            exact.truncate(10);
            // Every row rescored: exact search itself.
            assert_eq!(codes.search(&v, &q, 10, rows), exact, "query {seed}");
            // A fifth of the rows rescored: the scores are still exact, best
            // first, and most of the top 10 is found.
            let got = codes.search(&v, &q, 10, rows / 5);
            assert_eq!(got.len(), 10);
            assert!(got.windows(2).all(|w| w[0].1 >= w[1].1), "best first");
            for (row, score) in &got {
                assert_eq!(*score, dot(&v[row * dim..(row + 1) * dim], &q));
            }
            let found = got.iter().filter(|g| exact.contains(g)).count();
            assert!(found >= 8, "query {seed}: {found} of exact search's top 10");
        }
        assert_eq!(
            codes.search(&v, &v[..dim], 3, 0).len(),
            3,
            "rescore below k"
        );
    }
}
