//! Strided layouts: how a tensor's elements sit in its buffer (an offset and one stride per
//! dim, in elements), and the view algebra the planner uses to make reshape, permute, split and
//! concat free.
//!
//! Convention: a dim of size 1 has stride 0 (its stride never matters), so two layouts of the
//! same tensor are equal iff they address the same elements in the same order. Strides are never
//! negative; offsets are signed only while the planner derives a group's layouts, and shifted to
//! start at 0 afterwards.

/// What a kernel needs of an operand's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Req {
    /// Any strided layout (strided copies, fills).
    Any,
    /// Dense row-major.
    Contig,
    /// Over the last two dims a row-major or column-major matrix (a GEMM operand, transposes
    /// folded into its flag); leading (batch) dims with any strides.
    Matrix,
    /// Rows of the last dim contiguous (stride 1); other dims any stride (attention's heads
    /// inside a (B, T, C) row, a GEMM's output with a leading dimension).
    Rows,
}

/// Row-major strides of `shape`, with 0 for dims of size 1.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for d in (0..shape.len()).rev() {
        s[d] = if shape[d] == 1 { 0 } else { acc };
        acc *= shape[d] as isize;
    }
    s
}

/// Dense row-major (ignoring the strides of size-1 dims).
pub fn is_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut expect = 1isize;
    for d in (0..shape.len()).rev() {
        if shape[d] != 1 {
            if strides[d] != expect {
                return false;
            }
            expect *= shape[d] as isize;
        }
    }
    true
}

/// One past the last element addressed (0 for an empty tensor), relative to the offset.
pub fn extent(shape: &[usize], strides: &[isize]) -> isize {
    if shape.contains(&0) {
        return 0;
    }
    1 + shape.iter().zip(strides).map(|(&n, &s)| (n as isize - 1) * s).sum::<isize>()
}

/// No two elements share an address: sorted by stride, each dim (of size > 1) steps past
/// everything the smaller-stride dims reach. (Sufficient, not necessary: an interleaved layout
/// that fails it is refused and the planner copies instead.)
pub fn non_overlapping(shape: &[usize], strides: &[isize]) -> bool {
    let mut dims: Vec<(isize, usize)> =
        shape.iter().zip(strides).filter(|(&n, _)| n > 1).map(|(&n, &s)| (s.abs(), n)).collect();
    dims.sort_unstable();
    let mut reach = 0isize;
    for (s, n) in dims {
        if s <= reach {
            return false;
        }
        reach += s * (n as isize - 1);
    }
    true
}

/// Whether a layout meets a kernel's requirement.
pub fn satisfies(shape: &[usize], strides: &[isize], req: Req) -> bool {
    let r = shape.len();
    let unit = |d: usize| shape[d] == 1 || strides[d] == 1;
    match req {
        Req::Any => true,
        Req::Contig => is_contiguous(shape, strides),
        Req::Rows => r == 0 || unit(r - 1),
        Req::Matrix => {
            if r < 2 {
                return is_contiguous(shape, strides);
            }
            let (rows, cols) = (shape[r - 2], shape[r - 1]);
            let (sr, sc) = (strides[r - 2], strides[r - 1]);
            // Row-major with ld = sr >= cols, or column-major with ld = sc >= rows.
            (unit(r - 1) && (rows == 1 || sr >= cols as isize))
                || (unit(r - 2) && (cols == 1 || sc >= rows as isize))
        }
    }
}

/// The strides that view a tensor of `in_shape`/`in_strides` as `out_shape` (same element
/// count, row-major order), or None when the view needs a copy — PyTorch's `computeStride`
/// (aten/src/ATen/TensorUtils.cpp), run on the shapes with their size-1 dims removed.
pub fn reshape_strides(
    in_shape: &[usize],
    in_strides: &[isize],
    out_shape: &[usize],
) -> Option<Vec<isize>> {
    let numel: usize = in_shape.iter().product();
    if numel != out_shape.iter().product::<usize>() {
        return None;
    }
    let mut out = vec![0isize; out_shape.len()];
    if numel <= 1 {
        return Some(out);
    }
    let (os, ost): (Vec<usize>, Vec<isize>) =
        in_shape.iter().zip(in_strides).filter(|(&n, _)| n != 1).map(|(&n, &s)| (n, s)).unzip();
    let ns: Vec<(usize, usize)> =
        out_shape.iter().enumerate().filter(|(_, &n)| n != 1).map(|(i, &n)| (i, n)).collect();
    let mut view_d = ns.len() as isize - 1;
    let mut chunk_base = *ost.last()?;
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for td in (0..os.len()).rev() {
        tensor_numel *= os[td];
        if td == 0 || ost[td - 1] != tensor_numel as isize * chunk_base {
            while view_d >= 0 && view_numel < tensor_numel {
                let (i, n) = ns[view_d as usize];
                out[i] = view_numel as isize * chunk_base;
                view_numel *= n;
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if td > 0 {
                chunk_base = ost[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// out.strides[i] = in.strides[perm[i]]
pub fn permute_strides(strides: &[isize], perm: &[usize]) -> Vec<isize> {
    perm.iter().map(|&p| strides[p]).collect()
}

/// The input strides of a permute from its output's: in.strides[perm[i]] = out.strides[i].
pub fn unpermute_strides(out_strides: &[isize], perm: &[usize]) -> Vec<isize> {
    let mut s = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        s[p] = out_strides[i];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element's offset, in row-major order of `shape`.
    fn offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
        let n: usize = shape.iter().product();
        (0..n)
            .map(|mut flat| {
                let mut off = 0;
                for d in (0..shape.len()).rev() {
                    off += (flat % shape[d]) as isize * strides[d];
                    flat /= shape[d];
                }
                off
            })
            .collect()
    }

    #[test]
    fn reshape_of_contiguous_is_contiguous_and_of_heads_splits_the_row() {
        let s = contiguous_strides(&[2, 3, 8]);
        assert_eq!(reshape_strides(&[2, 3, 8], &s, &[6, 8]).unwrap(), vec![8, 1]);
        assert_eq!(
            reshape_strides(&[2, 3, 8], &s, &[2, 3, 1, 8, 1]).unwrap(),
            vec![24, 8, 0, 1, 0]
        );
        // GPT-2's q: a (B, T, C) piece of a (B, T, 3C) row, split into heads (B, T, H, D).
        let piece = [72isize, 24, 1]; // B=2, T=3, C=8 inside rows of 24
        let heads = reshape_strides(&[2, 3, 8], &piece, &[2, 3, 2, 4]).unwrap();
        assert_eq!(heads, vec![72, 24, 4, 1]);
        assert_eq!(offsets(&[2, 3, 2, 4], &heads), offsets(&[2, 3, 8], &piece));
        // Merging T into B is a view here (72 = 3·24), merging T and C is not (24 != 8).
        assert_eq!(reshape_strides(&[2, 3, 8], &piece, &[6, 8]).unwrap(), vec![24, 1]);
        assert!(reshape_strides(&[2, 3, 8], &piece, &[2, 24]).is_none());
    }

    #[test]
    fn reshape_of_permuted_merges_only_adjacent_dims() {
        // (B, H, T, D) permuted from (B, T, H, D): merging H and D back needs a copy.
        let bthd = contiguous_strides(&[2, 3, 2, 4]);
        let bhtd = permute_strides(&bthd, &[0, 2, 1, 3]);
        assert!(reshape_strides(&[2, 2, 3, 4], &bhtd, &[2, 2, 12]).is_none());
        assert!(reshape_strides(&[2, 2, 3, 4], &bhtd, &[4, 3, 4]).is_none());
        // The inverse permute gives back a contiguous tensor, which merges.
        let back = permute_strides(&bhtd, &[0, 2, 1, 3]);
        assert_eq!(back, bthd);
        assert_eq!(unpermute_strides(&bhtd, &[0, 2, 1, 3]), bthd);
        assert!(is_contiguous(&[2, 3, 2, 4], &back));
    }

    #[test]
    fn reshape_strides_agree_with_element_order_on_many_shapes() {
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[4, 6], &[1, 0], &[6, 4]), // transposed (6,4)->(4,6) view
            (&[2, 3, 4], &[0, 1, 2], &[6, 4]),
            (&[2, 3, 4], &[1, 0, 2], &[3, 2, 4]),
            (&[2, 1, 4], &[0, 1, 2], &[8]),
            (&[5, 1, 1], &[2, 0, 1], &[5]),
        ];
        for &(shape, perm, want) in cases {
            let strides = contiguous_strides(shape);
            let permuted_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let ps = permute_strides(&strides, perm);
            if let Some(rs) = reshape_strides(&permuted_shape, &ps, want) {
                assert_eq!(
                    offsets(want, &rs),
                    offsets(&permuted_shape, &ps),
                    "{shape:?} {perm:?} {want:?}"
                );
            }
        }
    }

    #[test]
    fn overlapping_layouts_are_told_apart() {
        assert!(non_overlapping(&[2, 3, 4], &contiguous_strides(&[2, 3, 4])));
        assert!(non_overlapping(&[2, 2, 3, 4], &[72, 4, 24, 1])); // heads inside (B, T, 3C)
        assert!(non_overlapping(&[2, 1, 5], &[5, 0, 1])); // size-1 dims have any stride
                                                          // A split piece's outer strides on the whole it was cut from: rows overlap.
        assert!(!non_overlapping(&[2, 2, 1, 36], &[24, 12, 0, 1]));
        assert!(!non_overlapping(&[3, 4], &[0, 1])); // a broadcast
    }

    #[test]
    fn requirements() {
        let c = contiguous_strides(&[2, 3, 4]);
        assert!(satisfies(&[2, 3, 4], &c, Req::Contig));
        let t = permute_strides(&c, &[0, 2, 1]); // (2, 4, 3), column-major matrices
        assert!(!satisfies(&[2, 4, 3], &t, Req::Contig));
        assert!(satisfies(&[2, 4, 3], &t, Req::Matrix));
        assert!(!satisfies(&[2, 4, 3], &t, Req::Rows));
        let heads = [72isize, 4, 24, 1]; // (B, H, T, D) inside (B, T, 3C)
        assert!(satisfies(&[2, 2, 3, 4], &heads, Req::Rows));
        assert!(satisfies(&[2, 2, 3, 4], &heads, Req::Matrix));
        assert_eq!(extent(&[2, 2, 3, 4], &heads), 72 + 4 + 48 + 4);
        assert!(satisfies(&[2, 3], &[1, 2], Req::Matrix)); // column-major, ld 2
        assert!(!satisfies(&[2, 3], &[7, 3], Req::Matrix)); // neither dim has unit stride
        assert!(!satisfies(&[2, 3], &[2, 1], Req::Matrix)); // overlapping rows (ld 2 < 3)
    }
}
