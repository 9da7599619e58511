package ncclep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// FP8 dispatch (--precision fp8; docs/fp8.md "NCCL EP") through NCCL EP's
// own quantization setting: the dispatch config's quant_recipe
// NCCL_EP_DISP_QUANT_FWD (nccl_ep.h, API version 2), under which the
// library forwards the caller's quantized tokens (e4m3, ncclFloat8e4m3
// [tokens, hidden]) and their scales (fp32 [tokens, hidden/128], DeepEP's
// 1×128 multipliers from the layer's quantize phase) as bytes, each slot's
// scale row beside its token row, in both modes. Its other recipe,
// DS_FP8E3M4, quantizes BF16 tokens inside the low-latency dispatch; it
// is not used: the layer quantizes every design's rows in its own timed
// phase, by the same rule, before any dispatch.
//
// The layer's rows are packed (each row's e4m3 values, then its
// multipliers: kernels.FP8RowPitch bytes), and the library's tensors have
// no row stride: the dispatch phase splits the rank's packed rows into the
// two tensors before the call, and the experts phase first joins each
// received slot's values and scales back into a packed row for the expert
// side's dequantization — per-row copies (CopyBatch) that the design does
// not make, timed in those phases (the record says so). The combine and
// the backward stay bf16.

// FP8Unavailable: at fp8 QUANT_FWD needs each token's and each scale row's
// bytes a multiple of 16 (nccl_ep.h: "token/scale rows plus their storage
// base … must be 16-byte aligned"): hidden/128 fp32 scales are 16-byte
// rows only when hidden is a multiple of 512.
func (d *Device) FP8Unavailable(env dispatchers.Env) string {
	if env.Hidden%512 != 0 {
		return fmt.Sprintf("NCCL EP's fp8 dispatch (quant_recipe NCCL_EP_DISP_QUANT_FWD) needs 16-byte scale rows (nccl_ep.h: token and scale rows "+
			"16-byte aligned): hidden/128 fp32 scales are %d B at --hidden %d; --hidden must be a multiple of 512", 4*(env.Hidden/128), env.Hidden)
	}
	return ""
}

// fp8Detail is what Library says of the fp8 dispatch.
const fp8Detail = "fp8: ncclEpDispatch with quant_recipe NCCL_EP_DISP_QUANT_FWD (the dispatch config at its V2 size), e4m3 tokens " +
	"and fp32 1×128 scales forwarded as bytes; the layer's packed rows split into the two tensors before the call (dispatch phase) " +
	"and each received slot's rejoined after it (experts phase), per-row copies the design does not make"

// fp8Buffers are rank r's fp8 buffers: the split send rows (xq, xs), the
// received scales (recvS; recvX holds the received e4m3 values) and the
// packed rows the experts read (pk), for n received slots at most.
func (d *Device) fp8Buffers(s *devRank, n int) []device.RowBuffer {
	T, h, S := int64(d.shape.Tokens), int64(d.shape.Hidden), int64(d.shape.Hidden/dispatchers.FP8Block)
	pitch := int64(kernels.FP8RowPitch(d.shape.Hidden))
	return []device.RowBuffer{{P: &s.xq, PerRow: T * h}, {P: &s.xs, PerRow: 4 * T * S}, {P: &s.recvX, PerRow: int64(n) * h},
		{P: &s.recvS, PerRow: 4 * int64(n) * S}, {P: &s.pk, PerRow: int64(n) * pitch}}
}

// split copies rank r's packed rows (DeviceRank.X) into its e4m3 values
// xq [T, h] and its scales xs [T, S].
func (d *Device) split(r int) error {
	s, rk := &d.st[r], d.ranks[r]
	T, h, sb := d.shape.Tokens, int64(d.shape.Hidden), 4*int64(d.shape.Hidden/dispatchers.FP8Block)
	pitch := int64(kernels.FP8RowPitch(d.shape.Hidden))
	s.ops = s.ops[:0]
	for t := range int64(T) {
		row := rk.X + device.Addr(t*pitch)
		s.ops = append(s.ops, device.CopyOp{Dst: s.xq + device.Addr(t*h), Src: row, Bytes: h},
			device.CopyOp{Dst: s.xs + device.Addr(t*sb), Src: row + device.Addr(h), Bytes: sb})
	}
	return rk.Dev.CopyBatch(s.ops, rk.Stream)
}

// join copies each received slot's e4m3 values (recvX) and scales (recvS)
// into its packed row (pk): high throughput the rows 0… the counts say,
// low latency each local expert's zone's first rows.
func (d *Device) join(r int) error {
	s, rk := &d.st[r], d.ranks[r]
	h, sb := int64(d.shape.Hidden), 4*int64(d.shape.Hidden/dispatchers.FP8Block)
	pitch := int64(kernels.FP8RowPitch(d.shape.Hidden))
	s.ops = s.ops[:0]
	add := func(slot int64) {
		s.ops = append(s.ops, device.CopyOp{Dst: s.pk + device.Addr(slot*pitch), Src: s.recvX + device.Addr(slot*h), Bytes: h},
			device.CopyOp{Dst: s.pk + device.Addr(slot*pitch+h), Src: s.recvS + device.Addr(slot*sb), Bytes: sb})
	}
	for l, n := range rk.ExpertRows {
		first := int64(0)
		if !d.ht() {
			first = int64(l * d.slots)
		} else {
			for _, m := range rk.ExpertRows[:l] {
				first += int64(m)
			}
		}
		for i := range int64(n) {
			add(first + i)
		}
	}
	if len(s.ops) == 0 {
		return nil
	}
	return rk.Dev.CopyBatch(s.ops, rk.Stream)
}
