package dispatchers

import (
	"strings"
	"testing"
)

// TestSMBudgetFit: a rank's budget on a GPU is at most its SMs ÷ the ranks
// on it (one block per SM, all resident at once): EP 8 packed on 132 SMs
// takes 16 (--sms 16), not 24 (naming --sms, the SMs and the ranks), and
// the default resolves to the smaller of the design's and what fits.
func TestSMBudgetFit(t *testing.T) {
	deepep := SMBudget{Default: 20, Even: true}
	hybrid := SMBudget{Default: 16}
	for _, c := range []struct {
		b             SMBudget
		n, sms, ranks int
		want          int
		err           string
	}{
		{deepep, 16, 132, 8, 16, ""},
		{deepep, 0, 132, 8, 16, ""},
		{deepep, 0, 132, 1, 20, ""},
		{deepep, 24, 132, 8, 0, "--sms 24: a rank's budget is at most 16: the GPU's 132 SMs ÷ its 8 rank(s)"},
		{deepep, 0, 132, 4, 20, ""},
		{deepep, 0, 20, 3, 6, ""}, // 6.67 → 6, even
		{deepep, 0, 8, 8, 0, "no budget fits: the GPU's 8 SMs ÷ its 8 rank(s)"},
		{hybrid, 0, 8, 8, 1, ""},
		{hybrid, 17, 132, 8, 0, "at most 16"},
		{hybrid, 0, 132, 2, 16, ""},
	} {
		got, err := c.b.Fit(c.n, c.sms, c.ranks)
		if c.err == "" && (err != nil || got != c.want) || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%+v.Fit(%d, %d SMs, %d ranks) = %d, %v; want %d, %q", c.b, c.n, c.sms, c.ranks, got, err, c.want, c.err)
		}
	}
}
