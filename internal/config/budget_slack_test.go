package config

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/allocator"
)

// TestBudgetSlack: MEMSCALE_BUDGET_SLACK is a finite decimal number up to
// MaxBudgetSlack; 0 and unset are the allocator's default, a negative value
// ignores the budget (stored as -1); anything else is refused with the
// variable, the value and what is accepted.
func TestBudgetSlack(t *testing.T) {
	tests := []struct {
		name, value string
		want        float64
		err         string // "" = accepted
	}{
		{name: "unset", value: "", want: allocator.DefaultBudgetSlack},
		{name: "blank", value: "  ", want: allocator.DefaultBudgetSlack},
		{name: "zero is the default", value: "0", want: allocator.DefaultBudgetSlack},
		{name: "minus zero is the default", value: "-0", want: allocator.DefaultBudgetSlack},
		{name: "0.3", value: " 0.3 ", want: 0.3},
		{name: "exponent", value: "2.5e-1", want: 0.25},
		{name: "max", value: "10", want: MaxBudgetSlack},
		{name: "negative ignores the budget", value: "-0.5", want: -1},
		{name: "minus one", value: "-1", want: -1},
		{name: "above max", value: "10.5", err: "above 10"},
		{name: "NaN", value: "NaN", err: "not a finite number"},
		{name: "inf", value: "inf", err: "not a finite number"},
		{name: "minus inf", value: "-Inf", err: "not a finite number"},
		{name: "huge", value: "1e400", err: "not a number"},
		{name: "percent", value: "10%", err: "not a number"},
		{name: "hex", value: "0x1p-3", err: "not a number"},
		{name: "underscore", value: "0_1", err: "not a number"},
		{name: "word", value: "ten", err: "not a number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(env(map[string]string{EnvBudgetSlack: tc.value}))
			if tc.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.want, c.BudgetSlack)
				return
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalid))
			var ve *VarError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, EnvBudgetSlack, ve.Name)
			msg := err.Error()
			assert.Contains(t, msg, EnvBudgetSlack)
			assert.Contains(t, msg, tc.value, "names the value")
			assert.Contains(t, msg, tc.err)
			assert.Contains(t, msg, "accepted: a decimal number at most 10")
			assert.Equal(t, allocator.DefaultBudgetSlack, c.BudgetSlack, "a refused value keeps the default")
		})
	}
}

// TestBudgetSlackJSON: the configuration JSON carries budget_slack.
func TestBudgetSlackJSON(t *testing.T) {
	c, err := Load(env(map[string]string{EnvBudgetSlack: "0.25"}))
	require.NoError(t, err)
	b, err := json.Marshal(c)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, 0.25, m["budget_slack"])
	assert.Contains(t, KnownVars(), EnvBudgetSlack)
	assert.Empty(t, Unknown([]string{EnvBudgetSlack + "=0.2"}))
}
