package kernels

// The backward's two GEMM shapes besides MatMulNT. With a linear layer
// y = x · Wᵀ (W [out,in]), the data gradient is dx = dy · W (MatMulNN) and
// the weight gradient is dW = dyᵀ · x (MatMulTNAdd, accumulated as
// Megatron's main_grad is).

// MatMulNN computes c[m,n] = a[m,k] · b[k,n] (both row-major), accumulating
// each element in F in order of k. Rows of c are split across GOMAXPROCS
// goroutines when the product is large.
func MatMulNN[F Float32Or64](c, a, b []F, m, n, k int) {
	if len(a) < m*k || len(b) < k*n || len(c) < m*n {
		panic("kernels.MatMulNN: operand shorter than its shape")
	}
	parallelRows(m, m*n*k, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			cr := c[i*n : i*n+n]
			clear(cr)
			for p, av := range a[i*k : i*k+k] {
				for j, bv := range b[p*n : p*n+n] {
					cr[j] += av * bv
				}
			}
		}
	})
}

// MatMulTNAdd adds a[k,m]ᵀ · b[k,n] to c[m,n] (all row-major): each element
// of c accumulates its k products in F, in order of k, on top of what it
// held. Rows of c are split across GOMAXPROCS goroutines when the product is
// large.
func MatMulTNAdd[F Float32Or64](c, a, b []F, m, n, k int) {
	if len(a) < k*m || len(b) < k*n || len(c) < m*n {
		panic("kernels.MatMulTNAdd: operand shorter than its shape")
	}
	parallelRows(m, m*n*k, func(lo, hi int) {
		for p := range k {
			br := b[p*n : p*n+n]
			for i, av := range a[p*m+lo : p*m+hi] {
				cr := c[(lo+i)*n : (lo+i)*n+n]
				for j, bv := range br {
					cr[j] += av * bv
				}
			}
		}
	})
}
