package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestParseLevel(t *testing.T) {
	tests := []struct {
		in      string
		want    zapcore.Level
		wantErr bool
	}{
		{in: "", want: zapcore.WarnLevel},
		{in: "debug", want: zapcore.DebugLevel},
		{in: "info", want: zapcore.InfoLevel},
		{in: "warn", want: zapcore.WarnLevel},
		{in: "error", want: zapcore.ErrorLevel},
		{in: "INFO", want: zapcore.InfoLevel},
		{in: "Debug", want: zapcore.DebugLevel},
		{in: "warning", wantErr: true},
		{in: " info", wantErr: true},
		{in: "fatal", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLevel(tc.in)
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), EnvLevel+"=")
				assert.Contains(t, err.Error(), `"`+tc.in+`"`)
				assert.Contains(t, err.Error(), "debug, info, warn, error")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestNewTo(t *testing.T) {
	tests := []struct {
		name, level, format string
		wantErr             string
		wantJSON            bool
		wantInfo            bool // an Info message is written
	}{
		{name: "defaults", wantInfo: false},
		{name: "info console", level: "info", format: "console", wantInfo: true},
		{name: "debug json", level: "debug", format: "json", wantInfo: true, wantJSON: true},
		{name: "error json", level: "error", format: "json", wantJSON: true},
		{name: "bad level", level: "verbose", wantErr: `MEMSCALE_LOG_LEVEL="verbose": unknown log level; accepted values: debug, info, warn, error`},
		{name: "bad format", level: "info", format: "text", wantErr: `MEMSCALE_LOG_FORMAT="text": unknown log format; accepted values: console, json`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := NewTo(&buf, tc.level, tc.format)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				assert.Nil(t, log)
				return
			}
			require.NoError(t, err)
			log.Info("hello", zap.Int("n", 1))
			log.Error("bad", zap.String("why", "test"))
			require.NoError(t, log.Sync())
			out := buf.String()
			assert.Equal(t, tc.wantInfo, strings.Contains(out, "hello"), out)
			require.Contains(t, out, "bad")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if tc.wantJSON {
				for _, l := range lines {
					var m map[string]any
					require.NoError(t, json.Unmarshal([]byte(l), &m), l)
					assert.Equal(t, "memscale", m["logger"])
				}
			} else {
				assert.Contains(t, out, "ERROR")
				assert.Contains(t, out, "memscale")
			}
		})
	}
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		level, format string
		wantErr       string
	}{
		{level: "", format: ""},
		{level: "debug", format: "json"},
		{level: "loud", wantErr: EnvLevel},
		{format: "xml", wantErr: EnvFormat},
	}
	for _, tc := range tests {
		t.Run(tc.level+"/"+tc.format, func(t *testing.T) {
			t.Setenv(EnvLevel, tc.level)
			t.Setenv(EnvFormat, tc.format)
			log, err := FromEnv()
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, log)
		})
	}
}
