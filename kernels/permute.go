package kernels

// PermuteOrder sorts the token copies of idx [tokens,k] expert-major — all
// copies routed to expert 0, then expert 1, … — keeping token order within an
// expert (Megatron's permute). It returns, for each permuted row, the flat slot
// t*k+j it came from, and the number of rows per expert, reusing the storage
// of slots and counts (which may be nil) when it is large enough.
func PermuteOrder(idx []int32, tokens, k, experts int, slots []int32, counts []int) ([]int32, []int) {
	counts = Reslice(counts, 2*experts) // counts, then the next free row of each expert
	clear(counts)
	counts, next := counts[:experts], counts[experts:]
	for _, e := range idx[:tokens*k] {
		counts[e]++
	}
	for e := 1; e < experts; e++ {
		next[e] = next[e-1] + counts[e-1]
	}
	slots = Reslice(slots, tokens*k)
	for s, e := range idx[:tokens*k] {
		slots[next[e]] = int32(s)
		next[e]++
	}
	return slots, counts
}

// GatherRows copies dst[i,:] = src[rows[i]/div, :] for every i; div is k when
// rows are slots t*k+j and the source is indexed by token, else 1.
func GatherRows[F Float32Or64](dst, src []F, rows []int32, div, cols int) {
	for i, r := range rows {
		s := int(r) / div
		copy(dst[i*cols:(i+1)*cols], src[s*cols:(s+1)*cols])
	}
}

// ScatterAddRows adds src[i,:] into dst[rows[i]/div, :] for every i, in order
// of i: the unpermute step, a plain sum of each token's k expert outputs.
func ScatterAddRows[F Float32Or64](dst, src []F, rows []int32, div, cols int) {
	for i, r := range rows {
		d := int(r) / div
		dr := dst[d*cols : (d+1)*cols]
		for j, v := range src[i*cols : (i+1)*cols] {
			dr[j] += v
		}
	}
}

// Reslice returns s resized to n elements, reusing its storage when it is large
// enough (the contents are not cleared).
func Reslice[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}
