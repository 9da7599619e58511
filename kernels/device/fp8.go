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
