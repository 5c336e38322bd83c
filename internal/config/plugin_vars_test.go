package config

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNonsenseIsRefused: values issue 32 found accepted. Each is refused
// with an error naming the variable, the value and what is accepted; the
// values around them are accepted as they should be.
func TestNonsenseIsRefused(t *testing.T) {
	tests := []struct {
		name, v, value string
		want           string // "" = accepted
		check          func(t *testing.T, c Config)
	}{
		{"op batch default", EnvOpBatch, "", "", func(t *testing.T, c Config) { assert.Equal(t, DefaultOpBatch, c.OpBatch) }},
		{"op batch 1", EnvOpBatch, "1", "", func(t *testing.T, c Config) { assert.Equal(t, 1, c.OpBatch) }},
		{"op batch max", EnvOpBatch, " 65536 ", "", func(t *testing.T, c Config) { assert.Equal(t, MaxOpBatch, c.OpBatch) }},
		{"op batch huge", EnvOpBatch, "99999999999999999999999", "too large", nil},
		{"op batch above max", EnvOpBatch, "65537", "out of range", nil},
		{"op batch 0", EnvOpBatch, "0", "out of range", nil},
		{"op batch negative", EnvOpBatch, "-3", "not a whole number", nil},
		{"op batch float", EnvOpBatch, "2.5", "not a whole number", nil},
		{"op batch hex", EnvOpBatch, "0x20", "not a whole number", nil},
		{"no extension 1", EnvNoExtension, "1", "", func(t *testing.T, c Config) { assert.True(t, c.NoExtension) }},
		{"no extension 0", EnvNoExtension, "0", "", func(t *testing.T, c Config) { assert.False(t, c.NoExtension) }},
		{"no extension unset", EnvNoExtension, " ", "", func(t *testing.T, c Config) { assert.False(t, c.NoExtension) }},
		{"no extension garbage", EnvNoExtension, "garbage", "one of 1, 0", nil},
		{"no extension yes", EnvNoExtension, "yes", "one of 1, 0", nil},
		{"native 1", EnvNative, "1", "", func(t *testing.T, c Config) {}},
		{"native 0", EnvNative, "0", "", func(t *testing.T, c Config) {}},
		{"native garbage", EnvNative, "yes", "one of 1, 0", nil},
		{"time factor max", EnvRecompTimeFactor, "8", "", func(t *testing.T, c Config) { assert.Equal(t, 8.0, c.RecompTimeFactor) }},
		{"time factor 110", EnvRecompTimeFactor, "110", "overflow", nil},
		{"memory factor 110", EnvRecompMemoryFactor, "110", "at most 8", nil},
		{"memory factor 8.01", EnvRecompMemoryFactor, "8.01", "above 8", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(env(map[string]string{tc.v: tc.value}))
			if tc.want == "" {
				require.NoError(t, err)
				tc.check(t, c)
				return
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalid))
			var ve *VarError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.v, ve.Name)
			assert.Contains(t, err.Error(), tc.value, "names the value")
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "accepted: ")
		})
	}
}

func TestPluginVarsAreKnown(t *testing.T) {
	assert.Empty(t, Unknown([]string{EnvOpBatch + "=4", EnvNoExtension + "=1"}))
	assert.Contains(t, KnownVars(), EnvOpBatch)
	assert.Contains(t, KnownVars(), EnvNoExtension)
}
