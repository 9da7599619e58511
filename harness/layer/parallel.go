package layer

import (
	"sync"
)

// ParallelFor runs fn(w, i) for i in 0..n-1 on the given number of
// goroutines, w being the goroutine's index.
func ParallelFor(n, workers int, fn func(w, i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := range min(n, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(w, i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
