package results

// A check's error can be infinite or NaN (an output or gradient that is not
// finite, a reference of zero where the result is not): JSON numbers cannot
// say so, and encoding/json refuses such a record, which a failed run would
// then lose. Correctness and GradCheck write these values as the strings
// "+Inf", "-Inf" and "NaN" and read them back; finite values stay numbers.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// errValue is a check's error in JSON.
type errValue float64

func (e errValue) MarshalJSON() ([]byte, error) {
	f := float64(e)
	switch {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Inf"`), nil
	}
	return json.Marshal(f)
}

func (e *errValue) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		switch s {
		case "NaN":
			*e = errValue(math.NaN())
		case "+Inf":
			*e = errValue(math.Inf(1))
		case "-Inf":
			*e = errValue(math.Inf(-1))
		default:
			return fmt.Errorf("error value %q: want a number, \"+Inf\", \"-Inf\" or \"NaN\"", s)
		}
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("error value %s: want a number, \"+Inf\", \"-Inf\" or \"NaN\"", b)
	}
	*e = errValue(f)
	return nil
}

// The fields below shadow the embedded ones of the same JSON name (the
// shallower field wins in encoding/json).

func (c Correctness) MarshalJSON() ([]byte, error) {
	type plain Correctness
	return json.Marshal(struct {
		plain
		MaxRelErr errValue `json:"max_rel_err"`
	}{plain(c), errValue(c.MaxRelErr)})
}

func (c *Correctness) UnmarshalJSON(b []byte) error {
	type plain Correctness
	aux := struct {
		*plain
		MaxRelErr errValue `json:"max_rel_err"`
	}{plain: (*plain)(c)}
	if err := strict(b, &aux); err != nil {
		return err
	}
	c.MaxRelErr = float64(aux.MaxRelErr)
	return nil
}

func (g GradCheck) MarshalJSON() ([]byte, error) {
	type plain GradCheck
	per := make(map[string]errValue, len(g.PerTensor))
	for k, v := range g.PerTensor {
		per[k] = errValue(v)
	}
	return json.Marshal(struct {
		plain
		MaxRelErr errValue            `json:"max_rel_err"`
		PerTensor map[string]errValue `json:"per_tensor"`
	}{plain(g), errValue(g.MaxRelErr), per})
}

func (g *GradCheck) UnmarshalJSON(b []byte) error {
	type plain GradCheck
	aux := struct {
		*plain
		MaxRelErr errValue            `json:"max_rel_err"`
		PerTensor map[string]errValue `json:"per_tensor"`
	}{plain: (*plain)(g)}
	if err := strict(b, &aux); err != nil {
		return err
	}
	g.MaxRelErr = float64(aux.MaxRelErr)
	g.PerTensor = nil
	if aux.PerTensor != nil {
		g.PerTensor = make(map[string]float64, len(aux.PerTensor))
		for k, v := range aux.PerTensor {
			g.PerTensor[k] = float64(v)
		}
	}
	return nil
}

// strict decodes b into v refusing unknown fields, as the record's reader
// does (its decoder's setting does not reach an UnmarshalJSON).
func strict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
