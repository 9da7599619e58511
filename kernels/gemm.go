package kernels

import (
	"runtime"
	"sync"
)

// Float32Or64 is the element type of host tensors: float32 for the host device,
// float64 for the reference.
type Float32Or64 interface{ ~float32 | ~float64 }

// MatMulNT computes c[m,n] = a[m,k] · b[n,k]ᵀ (both operands row-major, b in
// the [out,in] layout of a linear layer's weight), accumulating in F. Rows of c
// are split across GOMAXPROCS goroutines when the product is large.
func MatMulNT[F Float32Or64](c, a, b []F, m, n, k int) {
	if len(a) < m*k || len(b) < n*k || len(c) < m*n {
		panic("kernels.MatMulNT: operand shorter than its shape")
	}
	parallelRows(m, m*n*k, func(lo, hi int) { matMulRows(c, a, b, lo, hi, n, k) })
}

// SplitWork is the multiply-adds from which a GEMM splits its rows across
// goroutines (parallelRows); smaller ones run on the caller's.
const SplitWork = 1 << 18

// parallelRows calls fn on ranges of [0, m) that cover it, split across
// GOMAXPROCS goroutines when the work (multiply-adds) is at least
// SplitWork, else in one call on the caller's goroutine; it returns when
// every call has.
func parallelRows(m, work int, fn func(lo, hi int)) {
	workers := runtime.GOMAXPROCS(0)
	if work < SplitWork || workers == 1 || m < 2 {
		fn(0, m)
		return
	}
	if workers > m {
		workers = m
	}
	var wg sync.WaitGroup
	per := (m + workers - 1) / workers
	for lo := 0; lo < m; lo += per {
		hi := min(lo+per, m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

func matMulRows[F Float32Or64](c, a, b []F, lo, hi, n, k int) {
	for i := lo; i < hi; i++ {
		ar := a[i*k : i*k+k]
		cr := c[i*n : i*n+n]
		j := 0
		for ; j+4 <= n; j += 4 { // four dot products share each load of ar
			b0, b1, b2, b3 := b[j*k:j*k+k], b[(j+1)*k:(j+1)*k+k], b[(j+2)*k:(j+2)*k+k], b[(j+3)*k:(j+3)*k+k]
			var s0, s1, s2, s3 F
			for p, av := range ar {
				s0 += av * b0[p]
				s1 += av * b1[p]
				s2 += av * b2[p]
				s3 += av * b3[p]
			}
			cr[j], cr[j+1], cr[j+2], cr[j+3] = s0, s1, s2, s3
		}
		for ; j < n; j++ {
			br := b[j*k : j*k+k]
			var s F
			for p, av := range ar {
				s += av * br[p]
			}
			cr[j] = s
		}
	}
}
