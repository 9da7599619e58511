package hybridep

import (
	"fmt"
	"unsafe"

	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// The kernels' Go twins (device.Program.Twin), which device.Emu runs in
// their place: the same data movement on the device buffers, through the
// host implementation's preprocessing, orders and sums.

// twinRank is one rank's he_rank as a twin sees it.
type twinRank struct {
	x, idx, probs, gmap, dprobs, meta, todom, recvX, recvP, idX, idP, sendX, sendP, ex, ep, ey, y, shared, sync device.Addr
	dy, edy, edx, edp, dx, dp                                                                                   device.Addr // the backward's
}

// twinRanks reads the he_rank table at p.
func (d *Device) twinRanks(t device.TwinPart, p device.Addr) ([]twinRank, error) {
	ps, err := t.Ptrs(p, heRankFields*d.g.N)
	if err != nil {
		return nil, err
	}
	rs := make([]twinRank, d.g.N)
	for r := range rs {
		f := ps[r*heRankFields : (r+1)*heRankFields]
		rs[r] = twinRank{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15], f[16], f[17], f[18],
			f[19], f[20], f[21], f[22], f[23], f[24]}
	}
	return rs, nil
}

// view reinterprets device bytes as a slice of T.
func view[T any](b []byte) []T {
	var z T
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

// twinIO is a twin's access to device memory: reads and writes (recorded
// for Emu's stream-order check), the first error kept.
type twinIO struct {
	t   device.TwinPart
	err error
}

func (io *twinIO) read(p device.Addr, n int) []byte  { return io.access(p, n, io.t.Read) }
func (io *twinIO) write(p device.Addr, n int) []byte { return io.access(p, n, io.t.Write) }

// access is n bytes at p through f (the part's Read or Write), or zeros
// once an access failed.
func (io *twinIO) access(p device.Addr, n int, f func(device.Addr, int64) ([]byte, error)) []byte {
	if io.err != nil {
		return make([]byte, n)
	}
	b, err := f(p, int64(n))
	if err != nil {
		io.err, b = err, make([]byte, n)
	}
	return b
}

// rankIO is each rank's access: through the part that runs it (a
// kernel's accesses of a rank's memory, peers' stores and loads included,
// are recorded on that rank's stream: the kernel's own barriers order
// them, and Emu orders the parts around the whole launch).
func rankIO(parts []device.TwinPart, perRank func(t device.TwinPart) (first, count int)) []*twinIO {
	var ios []*twinIO
	for _, t := range parts {
		io := &twinIO{t: t}
		_, count := perRank(t)
		for range count {
			ios = append(ios, io)
		}
	}
	return ios
}

// firstErr is the first error of ios.
func firstErr(ios []*twinIO) error {
	for _, io := range ios {
		if io.err != nil {
			return io.err
		}
	}
	return nil
}

// parts' ranks: first and count of each part (a kernel's args[1], the grid
// and the blocks per rank).
func partRanks(t device.TwinPart, perRank int) (first, count int) {
	return int(t.Args[1].(int32)), t.Grid / perRank
}

// rows reads n bf16 rows of h at p as float32.
func (io *twinIO) rows(p device.Addr, n, h int) []float32 {
	return kernels.FromBF16Bits(view[uint16](io.read(p, 2*n*h)))
}

// meta reads rank r's preprocessing output into a meta (the layout of
// hybridep.cu's META_*).
func (d *Device) readMeta(io *twinIO, p device.Addr, todom device.Addr) meta {
	_, _, _, _, _, _, total := d.g.metaInts()
	return d.g.metaOf(view[int32](io.read(p, 4*total)), io.read(todom, d.g.T*d.g.M))
}

// metaOf is the meta of hybridep.cu's META_* ints and attn_to_rdma bytes.
func (g geom) metaOf(ints []int32, todom []byte) meta {
	s2d, d2e, counts, chunkAt, send, recv, total := g.metaInts()
	m := g.newMeta()
	copy(m.s2d, ints[s2d:d2e])
	copy(m.d2e, ints[d2e:counts])
	for e := range g.L {
		m.perExpert[e] = int(ints[counts+e])
	}
	m.recv = int(ints[counts+g.L])
	for i := range g.M {
		m.sends[i], m.recvs[i] = int(ints[counts+g.L+1+i]), int(ints[counts+g.L+1+g.M+i])
	}
	for i := range m.chunkAt {
		m.chunkAt[i] = int(ints[chunkAt+i])
	}
	copy(m.send, ints[send:recv])
	copy(m.recvIdx, ints[recv:total])
	for i, b := range todom {
		m.toDom[i] = b != 0
	}
	return m
}

func (d *Device) collParts(t device.TwinPart) (int, int) { return partRanks(t, d.cfg.SMs) }

// twinOpen opens a collective launch's twin: every rank's memory, the
// he_rank tables (the launch's fifth argument: each part's holds its own
// ranks' buffers) and, with metas, every rank's routing metadata.
func (d *Device) twinOpen(parts []device.TwinPart, metas bool) ([]*twinIO, []twinRank, []meta, error) {
	ios := rankIO(parts, d.collParts)
	R := make([]twinRank, d.g.N)
	for _, t := range parts {
		tab, err := d.twinRanks(t, t.Args[4].(device.Addr))
		if err != nil {
			return nil, nil, nil, err
		}
		first, count := d.collParts(t)
		copy(R[first:first+count], tab[first:first+count])
	}
	if !metas {
		return ios, R, nil, nil
	}
	ms := make([]meta, len(ios))
	for r, io := range ios {
		ms[r] = d.readMeta(io, R[r].meta, R[r].todom)
	}
	return ios, R, ms, nil
}

func (d *Device) allgatherTwin(parts []device.TwinPart) error {
	g := d.g
	T, E, k, M, LD, ldp := g.T, g.E, d.shape.TopK, g.M, g.L*g.D, g.ldp()
	ios, R, _, err := d.twinOpen(parts, false)
	if err != nil {
		return err
	}
	for r, io := range ios {
		idx := view[int32](io.read(R[r].idx, 4*T*k))
		probs := view[float32](io.read(R[r].probs, 4*T*k))
		rows, dense := make([]bool, T*E), make([]float32, T*E)
		if err := denseRows(idx, probs, T, E, k, rows, dense); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		for q := range R {
			b := ios[q].write(R[q].gmap+device.Addr(r*T*E), T*E)
			for i, on := range rows {
				b[i] = 0
				if on {
					b[i] = 1
				}
			}
		}
		dp := view[float32](io.write(R[r].dprobs, 4*T*M*ldp))
		for t := range T {
			for m := range M {
				clear(dp[(t*M+m)*ldp : (t*M+m+1)*ldp])
				copy(dp[(t*M+m)*ldp:], dense[t*E+m*LD:t*E+(m+1)*LD])
			}
		}
	}
	return firstErr(ios)
}

func (d *Device) preprocessTwin(parts []device.TwinPart) error {
	g := d.g
	for _, t := range parts {
		io := &twinIO{t: t}
		R, err := d.twinRanks(t, t.Args[2].(device.Addr))
		if err != nil {
			return err
		}
		first, count := int(t.Args[0].(int32)), t.Grid/int(t.Args[1].(int32))
		for r := first; r < first+count; r++ {
			gmap := make([]bool, g.N*g.T*g.E)
			for i, b := range io.read(R[r].gmap, len(gmap)) {
				gmap[i] = b != 0
			}
			m := g.newMeta()
			g.preprocess(r, gmap, &m)
			s2d, d2e, counts, chunkAt, send, recv, total := g.metaInts()
			ints := view[int32](io.write(R[r].meta, 4*total))
			copy(ints[s2d:], m.s2d)
			copy(ints[d2e:d2e+m.recv*g.L], m.d2e[:m.recv*g.L])
			for e := range g.L {
				ints[counts+e] = int32(m.perExpert[e])
			}
			ints[counts+g.L] = int32(m.recv)
			for i := range g.M {
				ints[counts+g.L+1+i], ints[counts+g.L+1+g.M+i] = int32(m.sends[i]), int32(m.recvs[i])
			}
			for i, v := range m.chunkAt {
				ints[chunkAt+i] = int32(v)
			}
			copy(ints[send:], m.send)
			copy(ints[recv:], m.recvIdx)
			td := io.write(R[r].todom, g.T*g.M)
			for i, on := range m.toDom {
				td[i] = 0
				if on {
					td[i] = 1
				}
			}
		}
		if io.err != nil {
			return io.err
		}
	}
	return nil
}

func (d *Device) packTwin(parts []device.TwinPart) error    { return d.packTwinOf(parts, false) }
func (d *Device) packBwdTwin(parts []device.TwinPart) error { return d.packTwinOf(parts, true) }

// packTwinOf: he_pack, or (bwd) he_pack_bwd: the output gradients' rows
// alone.
func (d *Device) packTwinOf(parts []device.TwinPart, bwd bool) error {
	g, h := d.g, d.shape.Hidden
	if !bwd { // the forward dispatch's rows (packed fp8 rows at fp8)
		h = d.shape.DispatchWidth()
	}
	ldp := g.ldp()
	for _, t := range parts {
		io := &twinIO{t: t}
		R, err := d.twinRanks(t, t.Args[2].(device.Addr))
		if err != nil {
			return err
		}
		first, count := int(t.Args[0].(int32)), t.Grid/d.cfg.SMs
		for r := first; r < first+count; r++ {
			m := d.readMeta(io, R[r].meta, R[r].todom)
			n := r / g.D
			for dm := range g.M {
				for tk := range g.T {
					c := m.send[dm*g.T+tk]
					if dm == n || c < 0 {
						continue
					}
					at := tile(dm, n)*g.T + int(c)
					if bwd {
						copy(io.write(R[r].sendX+device.Addr(2*at*h), 2*h), io.read(R[r].dy+device.Addr(2*tk*h), 2*h))
						continue
					}
					copy(io.write(R[r].sendX+device.Addr(2*at*h), 2*h), io.read(R[r].x+device.Addr(2*tk*h), 2*h))
					copy(io.write(R[r].sendP+device.Addr(4*at*ldp), 4*ldp), io.read(R[r].dprobs+device.Addr(4*(tk*g.M+dm)*ldp), 4*ldp))
				}
			}
		}
		if io.err != nil {
			return io.err
		}
	}
	return nil
}

func (d *Device) dispatchTwin(parts []device.TwinPart) error { return d.dispatchTwinOf(parts, false) }
func (d *Device) dispatchBwdTwin(parts []device.TwinPart) error {
	return d.dispatchTwinOf(parts, true)
}

// dispatchTwinOf: every forwarder's stores (design order); bwd: the
// output gradients' rows alone.
func (d *Device) dispatchTwinOf(parts []device.TwinPart, bwd bool) error {
	g, h := d.g, d.shape.Hidden
	if !bwd { // the forward dispatch's rows (packed fp8 rows at fp8)
		h = d.shape.DispatchWidth()
	}
	ldp, rowB := g.ldp(), 2*h
	ios, R, ms, err := d.twinOpen(parts, true)
	if err != nil {
		return err
	}
	for f, io := range ios {
		n := f / g.D
		for b := range d.cfg.SMs {
			g.forwardOrder(n, b, d.cfg.SMs, func(m, t int) {
				var row, pr device.Addr
				if m == n {
					if !ms[f].toDom[t*g.M+n] {
						return
					}
					row, pr = R[f].x+device.Addr(t*rowB), R[f].dprobs+device.Addr(4*(t*g.M+n)*ldp)
					if bwd {
						row = R[f].dy + device.Addr(t*rowB)
					}
				} else {
					c := ms[f].recvIdx[m*g.T+t]
					if c < 0 {
						return
					}
					at := tile(m, n)*g.T + int(c)
					row, pr = R[f].idX+device.Addr(at*rowB), R[f].idP+device.Addr(4*at*ldp)
				}
				x := io.read(row, rowB)
				var p []byte
				if !bwd {
					p = io.read(pr, 4*ldp)
				}
				eachDomainTerm(ms[f].s2d[(m*g.T+t)*g.D:(m*g.T+t+1)*g.D], func(j, pos int) {
					q := n*g.D + j
					copy(ios[q].write(R[q].recvX+device.Addr(pos*rowB), rowB), x)
					if !bwd {
						copy(ios[q].write(R[q].recvP+device.Addr(4*pos*ldp), 4*ldp), p)
					}
				})
			})
		}
	}
	return firstErr(ios)
}

func (d *Device) permuteTwin(parts []device.TwinPart) error    { return d.permuteTwinOf(parts, false) }
func (d *Device) permuteBwdTwin(parts []device.TwinPart) error { return d.permuteTwinOf(parts, true) }

// permuteTwinOf: he_permute, each rank's received rows to its experts'
// rows with their probabilities; or (bwd) he_permute_bwd, the output
// gradients' rows into ExpertDY.
func (d *Device) permuteTwinOf(parts []device.TwinPart, bwd bool) error {
	g, rowB := d.g, 2*d.shape.Hidden
	if !bwd { // the forward dispatch's rows (packed fp8 rows at fp8)
		rowB = 2 * d.shape.DispatchWidth()
	}
	ldp := g.ldp()
	for _, t := range parts {
		io := &twinIO{t: t}
		R, err := d.twinRanks(t, t.Args[2].(device.Addr))
		if err != nil {
			return err
		}
		first, count := int(t.Args[0].(int32)), t.Grid/int(t.Args[1].(int32))
		for r := first; r < first+count; r++ {
			me, l := R[r], r%g.D
			m := d.readMeta(io, me.meta, me.todom)
			for i := range m.recv {
				for e, p := range m.d2e[i*g.L : (i+1)*g.L] {
					if p < 0 {
						continue
					}
					if bwd {
						copy(io.write(me.edy+device.Addr(int(p)*rowB), rowB), io.read(me.recvX+device.Addr(i*rowB), rowB))
						continue
					}
					copy(io.write(me.ex+device.Addr(int(p)*rowB), rowB), io.read(me.recvX+device.Addr(i*rowB), rowB))
					copy(io.write(me.ep+device.Addr(4*int(p)), 4), io.read(me.recvP+device.Addr(4*(i*ldp+l*g.L+e)), 4))
				}
			}
		}
		if io.err != nil {
			return io.err
		}
	}
	return nil
}

func (d *Device) combineTwin(parts []device.TwinPart) error    { return d.combineTwinOf(parts, false) }
func (d *Device) combineBwdTwin(parts []device.TwinPart) error { return d.combineTwinOf(parts, true) }

// combineTwinOf: stage 1 (or 0), every rank's partial sums, then the
// pre-reductions; stage 2 (or 0), every home's sum. bwd: the input
// gradients into DX (no shared expert), and the probability gradients as
// he_combine_bwd carries them (he_dp_*: each received row's L·D places,
// their float32 sums from 0 per domain, each slot's at home).
func (d *Device) combineTwinOf(parts []device.TwinPart, bwd bool) error {
	g, h := d.g, d.shape.Hidden
	rowB, ldp, LD, k := 2*h, g.ldp(), g.L*g.D, d.shape.TopK
	ios, R, ms, err := d.twinOpen(parts, true)
	if err != nil {
		return err
	}
	stage := parts[0].Args[6].(int32)
	put := func(io *twinIO, p device.Addr, v []float32) {
		copy(view[uint16](io.write(p, 2*len(v))), kernels.BF16Bits(v))
	}
	partial := func(q, p int) []float32 { return ios[q].rows(R[q].recvX+device.Addr(p*rowB), 1, h) }
	// domainP is the float32 sum from 0 of the probability gradients at
	// place e of reader's domain's rows of source (sn, ·)'s token t
	domainP := func(reader, sn, t, e int) float32 {
		acc, m := float32(0), reader/g.D
		eachDomainTerm(ms[reader].s2d[(sn*g.T+t)*g.D:(sn*g.T+t+1)*g.D], func(j, p int) {
			q := m*g.D + j
			acc += view[float32](ios[q].read(R[q].recvP+device.Addr(4*(p*ldp+e)), 4))[0]
		})
		return acc
	}
	sum := make([]float32, h)
	if stage != 2 {
		for r, io := range ios {
			ey := R[r].ey
			if bwd {
				ey = R[r].edx
			}
			for i := range ms[r].recv {
				partialSum(sum, ms[r].d2e[i*g.L:(i+1)*g.L], func(row int) []float32 { return io.rows(ey+device.Addr(row*rowB), 1, h) })
				put(io, R[r].recvX+device.Addr(i*rowB), sum)
			}
			if !bwd {
				continue
			}
			l := r % g.D
			pr := view[float32](io.write(R[r].recvP, 4*ms[r].recv*ldp))
			for i := range ms[r].recv {
				row := pr[i*ldp : (i+1)*ldp]
				clear(row)
				for e, p := range ms[r].d2e[i*g.L : (i+1)*g.L] {
					if p >= 0 {
						row[l*g.L+e] = view[float32](io.read(R[r].edp+device.Addr(4*int(p)), 4))[0]
					}
				}
			}
		}
		for f, io := range ios { // pre-reduction for the other domains' homes
			m := f / g.D
			g.otherDomains(m, func(sn int) {
				for t := range g.T {
					c := ms[f].recvIdx[sn*g.T+t]
					if c < 0 {
						continue
					}
					clear(sum)
					eachDomainTerm(ms[f].s2d[(sn*g.T+t)*g.D:(sn*g.T+t+1)*g.D], func(j, p int) { add(sum, partial(m*g.D+j, p)) })
					kernels.RoundBF16Slice(sum)
					at := tile(sn, m)*g.T + int(c)
					put(io, R[f].sendX+device.Addr(at*rowB), sum)
					if bwd {
						pr := view[float32](io.write(R[f].sendP+device.Addr(4*at*ldp), 4*ldp))
						for e := range pr {
							pr[e] = 0
							if e < LD {
								pr[e] = domainP(f, sn, t, e)
							}
						}
					}
				}
			})
		}
	}
	if stage != 1 {
		for r, io := range ios {
			n, me := r/g.D, R[r]
			out, shared := me.y, me.shared
			if bwd {
				out, shared = me.dx, 0
			}
			for t := range g.T {
				clear(sum)
				eachDomainTerm(ms[r].s2d[(n*g.T+t)*g.D:(n*g.T+t+1)*g.D], func(j, p int) { add(sum, partial(n*g.D+j, p)) })
				g.otherDomains(n, func(dm int) {
					if ms[r].toDom[t*g.M+dm] {
						add(sum, io.rows(me.idX+device.Addr((tile(dm, n)*g.T+int(ms[r].send[dm*g.T+t]))*rowB), 1, h))
					}
				})
				kernels.RoundBF16Slice(sum)
				if shared != 0 {
					for i, v := range io.rows(shared+device.Addr(t*rowB), 1, h) {
						sum[i] = kernels.RoundBF16(sum[i] + v)
					}
				}
				put(io, out+device.Addr(t*rowB), sum)
			}
			if !bwd {
				continue
			}
			idx := view[int32](io.read(me.idx, 4*g.T*k))
			dp := view[float32](io.write(me.dp, 4*g.T*k))
			for x, ex := range idx {
				t, dm, e := x/k, int(ex)/LD, int(ex)%LD
				if dm == n {
					dp[x] = domainP(r, n, t, e)
					continue
				}
				acc := float32(0)
				acc += view[float32](io.read(me.idP+device.Addr(4*((tile(dm, n)*g.T+int(ms[r].send[dm*g.T+t]))*ldp+e)), 4))[0]
				dp[x] = acc
			}
		}
	}
	return firstErr(ios)
}
