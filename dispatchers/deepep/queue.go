package deepep

import "fmt"

// queue is one (channel, peer) ring in a receiver's buffer: Ring slots,
// each a row (bf16 values held in float32), the token's index at its
// source and, in dispatch, its k expert indices and probabilities. head and
// tail count the tokens taken and pushed since the step began; a token's
// slot is its count mod Ring.
type queue struct {
	ring, width, k int
	x              []float32 // [ring, width]
	src            []int32   // [ring]
	idx            []int32   // [ring, k]
	w              []float32 // [ring, k]
	sw             int       // fp8 dispatch: scales per row (hidden/128), else 0
	sc             []float32 // [ring, sw] the rows' fp32 scales
	head, tail     int
	start, end     int // dispatch: the channel's offsets among the source's tokens for this receiver
}

// reset empties q for a new channel with rings of ring slots of width
// values and k expert slots (0 in combine), reusing its storage.
func (q *queue) reset(ring, width, k int) *queue {
	q.ring, q.width, q.k, q.head, q.tail = ring, width, k, 0, 0
	if cap(q.x) < ring*width {
		q.x = make([]float32, ring*width)
	}
	if cap(q.idx) < ring*k {
		q.idx, q.w = make([]int32, ring*k), make([]float32, ring*k)
	}
	if cap(q.src) < ring {
		q.src = make([]int32, ring)
	}
	q.x, q.src, q.idx, q.w = q.x[:ring*width], q.src[:ring], q.idx[:ring*k], q.w[:ring*k]
	q.sw = 0
	return q
}

// withScales gives q's slots sw fp32 scales each besides the row (fp8
// dispatch: DeepEP's x_scales travel in the same slot as x).
func (q *queue) withScales(sw int) *queue {
	q.sw = sw
	if cap(q.sc) < q.ring*sw {
		q.sc = make([]float32, q.ring*sw)
	}
	q.sc = q.sc[:q.ring*sw]
	return q
}

// free is the slots a sender may fill.
func (q *queue) free() int { return q.ring - (q.tail - q.head) }

// push writes a token at the tail and advances it; topk gives its slot j's
// expert index and probability (nil in combine). The caller has checked
// free.
func (q *queue) push(row, scales []float32, src int32, topk func(j int) (int32, float32)) {
	s := q.tail % q.ring
	copy(q.x[s*q.width:(s+1)*q.width], row)
	copy(q.sc[s*q.sw:(s+1)*q.sw], scales)
	q.src[s] = src
	for j := range q.k {
		q.idx[s*q.k+j], q.w[s*q.k+j] = topk(j)
	}
	q.tail++
}

// pop copies the token at the head out and advances the head.
func (q *queue) pop(row, scales []float32, src *int32, idx []int32, w []float32) {
	s := q.head % q.ring
	copy(row, q.x[s*q.width:(s+1)*q.width])
	copy(scales, q.sc[s*q.sw:(s+1)*q.sw])
	*src = q.src[s]
	copy(idx, q.idx[s*q.k:(s+1)*q.k])
	copy(w, q.w[s*q.k:(s+1)*q.k])
	q.head++
}

// add adds the row at stream position pos (pushed, not yet overwritten) to
// y, and its k values to w when the queue carries them, after checking
// that it is token want's.
func (q *queue) add(y, w []float32, pos int, want int32) error {
	if pos < q.head || pos >= q.tail || pos < q.tail-q.ring {
		return fmt.Errorf("token %d expected at position %d, queue holds [%d, %d)", want, pos, max(q.head, q.tail-q.ring), q.tail)
	}
	s := pos % q.ring
	if q.src[s] != want {
		return fmt.Errorf("position %d holds token %d, expected token %d", pos, q.src[s], want)
	}
	for c, v := range q.x[s*q.width : (s+1)*q.width] {
		y[c] += v
	}
	for j, v := range q.w[s*q.k : (s+1)*q.k] {
		w[j] += v
	}
	return nil
}

// describe says what a stalled queue waited for.
func (q *queue) describe(missing int) string {
	return fmt.Sprintf("%d tokens still expected; head %d, tail %d, %d of %d slots free", missing, q.head, q.tail, q.free(), q.ring)
}
