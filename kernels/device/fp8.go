package device

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moebench/moebench/kernels"
)

// FP8QuantProgram is quant_fp8_1x128: (x bf16, n int64 blocks of 128,
// flags int32, q e4m3, scales fp32).
func FP8QuantProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "quant_fp8_1x128", Block: kernels.FP8KernelBlock}
}

// MXFP8QuantProgram is quant_mxfp8: (x bf16, n int64 blocks of 32, flags
// int32, q e4m3, scales e8m0 bytes).
func MXFP8QuantProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "quant_mxfp8", Block: kernels.FP8KernelBlock}
}

// FP8DequantProgram is dequant_fp8_1x128: (q e4m3, scales fp32, n int64
// blocks of 128, y bf16).
func FP8DequantProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "dequant_fp8_1x128", Block: kernels.FP8KernelBlock}
}

// FP8QuantRowsProgram is quant_fp8_rows: (x bf16, n int64 blocks of 128,
// flags int32, S int32 blocks a row, pitch int64 bytes a row, out packed
// rows): quant_fp8_1x128 into packed rows (FP8RowPitch).
func FP8QuantRowsProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "quant_fp8_rows", Block: kernels.FP8KernelBlock, Twin: fp8RowsTwin(false)}
}

// FP8DequantRowsProgram is dequant_fp8_rows: (in packed rows, n int64
// blocks of 128, S int32, pitch int64, y bf16 [n/S, S·128]).
func FP8DequantRowsProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "dequant_fp8_rows", Block: kernels.FP8KernelBlock, Twin: fp8RowsTwin(true)}
}

// fp8RowsTwin is the packed-row kernels on Emu, through the host
// functions.
func fp8RowsTwin(dequant bool) func([]TwinPart) error {
	return func(parts []TwinPart) error {
		for _, p := range parts {
			if err := fp8RowsTwinPart(p, dequant); err != nil {
				return err
			}
		}
		return nil
	}
}

func fp8RowsTwinPart(p TwinPart, dequant bool) error {
	a := p.Args
	if len(a) != 6 && !dequant || len(a) != 5 && dequant {
		return fmt.Errorf("fp8 rows: %d arguments", len(a))
	}
	at := 0
	if !dequant {
		at = 1
	}
	in, n, S, pitch, out := a[0].(Addr), a[1].(int64), int64(a[2+at].(int32)), a[3+at].(int64), a[4+at].(Addr)
	if S <= 0 || n%S != 0 || pitch < S*(kernels.FP8Block+4) {
		return fmt.Errorf("fp8 rows: %d blocks of %d a row, pitch %d", n, S, pitch)
	}
	rows, h := n/S, S*kernels.FP8Block
	if dequant {
		pb, err := p.Read(in, rows*pitch)
		if err != nil {
			return err
		}
		yb, err := p.Write(out, 2*n*kernels.FP8Block)
		if err != nil {
			return err
		}
		q, sc := make([]uint8, n*kernels.FP8Block), make([]float32, n)
		for r := range rows {
			row := pb[r*pitch:]
			copy(q[r*h:(r+1)*h], row[:h])
			for b := range S {
				sc[r*S+b] = math.Float32frombits(binary.LittleEndian.Uint32(row[h+4*b:]))
			}
		}
		for i, v := range kernels.BF16Bits(kernels.DequantFP8Rows(q, sc)) {
			binary.LittleEndian.PutUint16(yb[2*i:], v)
		}
		return nil
	}
	flags := a[2].(int32)
	xb, err := p.Read(in, 2*n*kernels.FP8Block)
	if err != nil {
		return err
	}
	xs := make([]float32, n*kernels.FP8Block)
	for i := range xs {
		xs[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(xb[2*i:])) << 16)
	}
	q, sc, err := kernels.QuantFP8Rows(xs, int(h), flags&kernels.FP8UE8M0 != 0)
	if err != nil {
		return err
	}
	ob, err := p.Write(out, rows*pitch)
	if err != nil {
		return err
	}
	for r := range rows {
		row := ob[r*pitch:]
		copy(row[:h], q[r*h:(r+1)*h])
		for b := range S {
			binary.LittleEndian.PutUint32(row[h+4*b:], math.Float32bits(sc[r*S+b]))
		}
	}
	return nil
}

// FP8RowsLtProgram is fp8_rows_lt: (in packed rows, m int32 rows, S int32
// blocks a row, pitch int64 bytes a row, q e4m3 [m, S·128], s fp32
// [S][m]): packed rows into the operand of cuBLASLt's block-scaled FP8
// GEMM, the multipliers in VEC128_32F's order (kernels.FP8ActScalesLt).
func FP8RowsLtProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "fp8_rows_lt", Block: kernels.FP8KernelBlock, Twin: fp8LtTwin(false)}
}

// FP8QuantLtProgram is quant_fp8_lt: (x bf16 [m, k], m int32, k int32,
// flags int32, q e4m3 [m, k], s fp32 [⌈k/128⌉][m]): kernels.QuantFP8RowsK
// on bf16 rows, the multipliers in VEC128_32F's order.
func FP8QuantLtProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "quant_fp8_lt", Block: kernels.FP8KernelBlock, Twin: fp8LtTwin(true)}
}

// fp8LtTwin is fp8_rows_lt (quant false) or quant_fp8_lt on Emu, through
// the host functions.
func fp8LtTwin(quant bool) func([]TwinPart) error {
	return func(parts []TwinPart) error {
		for _, p := range parts {
			if err := fp8LtTwinPart(p, quant); err != nil {
				return err
			}
		}
		return nil
	}
}

func fp8LtTwinPart(p TwinPart, quant bool) error {
	a := p.Args
	if len(a) != 6 {
		return fmt.Errorf("fp8 lt: %d arguments", len(a))
	}
	in, m, outQ, outS := a[0].(Addr), int(a[1].(int32)), a[4].(Addr), a[5].(Addr)
	var q []uint8
	var s []float32
	var k int
	if quant {
		k = int(a[2].(int32))
		if m < 0 || k <= 0 {
			return fmt.Errorf("quant_fp8_lt: %d rows of %d", m, k)
		}
		xb, err := p.Read(in, int64(2*m*k))
		if err != nil {
			return err
		}
		x := make([]float32, m*k)
		for i := range x {
			x[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(xb[2*i:])) << 16)
		}
		q, s = kernels.QuantFP8RowsK(x, m, k)
	} else {
		S, pitch := int(a[2].(int32)), int(a[3].(int64))
		k = S * kernels.FP8Block
		if m < 0 || S <= 0 || pitch < S*(kernels.FP8Block+4) {
			return fmt.Errorf("fp8_rows_lt: %d rows of %d blocks, pitch %d", m, S, pitch)
		}
		pb, err := p.Read(in, int64(m*pitch))
		if err != nil {
			return err
		}
		q, s = make([]uint8, m*k), make([]float32, m*S)
		for r := range m {
			row := pb[r*pitch:]
			copy(q[r*k:(r+1)*k], row[:k])
			for b := range S {
				s[r*S+b] = math.Float32frombits(binary.LittleEndian.Uint32(row[k+4*b:]))
			}
		}
	}
	s = kernels.FP8ActScalesLt(s, m, k)
	qb, err := p.Write(outQ, int64(len(q)))
	if err != nil {
		return err
	}
	copy(qb, q)
	sb, err := p.Write(outS, int64(4*len(s)))
	if err != nil {
		return err
	}
	for i, v := range s {
		binary.LittleEndian.PutUint32(sb[4*i:], math.Float32bits(v))
	}
	return nil
}

// FP8AmaxTensorProgram is amax_fp8_tensor: (x bf16, n int64 values, amax
// uint32 word): the max |x| of n values into *amax (atomicMax on the
// float's bits; the caller zeroes it first).
func FP8AmaxTensorProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "amax_fp8_tensor", Block: kernels.FP8KernelBlock, Twin: fp8TensorTwin(false)}
}

// FP8QuantTensorProgram is quant_fp8_tensor: (x bf16, n int64 values,
// flags int32, amax uint32 word, q e4m3 [n], s fp32 [1]): n values
// quantized with one multiplier from *amax (kernels.QuantFP8Tensor when
// *amax is their max |x|).
func FP8QuantTensorProgram() *Program {
	return &Program{File: "fp8.cu", Kernel: "quant_fp8_tensor", Block: kernels.FP8KernelBlock, Twin: fp8TensorTwin(true)}
}

// fp8TensorTwin is amax_fp8_tensor (quant false) or quant_fp8_tensor on
// Emu.
func fp8TensorTwin(quant bool) func([]TwinPart) error {
	return func(parts []TwinPart) error {
		for _, p := range parts {
			if err := fp8TensorTwinPart(p, quant); err != nil {
				return err
			}
		}
		return nil
	}
}

func fp8TensorTwinPart(p TwinPart, quant bool) error {
	a := p.Args
	if !quant && len(a) != 3 || quant && len(a) != 6 {
		return fmt.Errorf("fp8 tensor: %d arguments", len(a))
	}
	n := a[1].(int64)
	if n < 0 {
		return fmt.Errorf("fp8 tensor: %d values", n)
	}
	xb, err := p.Read(a[0].(Addr), 2*n)
	if err != nil {
		return err
	}
	x := make([]float32, n)
	for i := range x {
		x[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(xb[2*i:])) << 16)
	}
	var at Addr
	if quant {
		at = a[3].(Addr)
	} else {
		at = a[2].(Addr)
	}
	wb, err := p.Read(at, 4)
	if err != nil {
		return err
	}
	word := binary.LittleEndian.Uint32(wb)
	if !quant { // atomicMax of the word and each value's bits (the values' max: order-free)
		am := math.Float32bits(kernels.BlockAmax(x))
		ob, err := p.Write(at, 4)
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(ob, max(word, am))
		return nil
	}
	scale, inv := kernels.FP8Scales(math.Float32frombits(word), false)
	qb, err := p.Write(a[4].(Addr), n)
	if err != nil {
		return err
	}
	for i, v := range x {
		qb[i] = kernels.E4M3FromFloat32(v * scale)
	}
	sb, err := p.Write(a[5].(Addr), 4)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(sb, math.Float32bits(inv))
	return nil
}
