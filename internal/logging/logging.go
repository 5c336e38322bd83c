// Package logging builds the zap logger memscale writes to stderr, configured
// by MEMSCALE_LOG_LEVEL (debug|info|warn|error, default warn) and
// MEMSCALE_LOG_FORMAT (console|json, default console). A value outside those is
// an error that names the variable, the value and the accepted values; it is
// never replaced by the default.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// EnvLevel is the environment variable holding the log level.
const EnvLevel = "MEMSCALE_LOG_LEVEL"

// EnvFormat is the environment variable holding the log format.
const EnvFormat = "MEMSCALE_LOG_FORMAT"

// DefaultLevel is the level used when MEMSCALE_LOG_LEVEL is unset or empty.
const DefaultLevel = "warn"

// DefaultFormat is the format used when MEMSCALE_LOG_FORMAT is unset or empty.
const DefaultFormat = "console"

// AcceptedLevels lists the accepted values of MEMSCALE_LOG_LEVEL.
const AcceptedLevels = "debug, info, warn, error"

// AcceptedFormats lists the accepted values of MEMSCALE_LOG_FORMAT.
const AcceptedFormats = "console, json"

// ParseLevel parses a MEMSCALE_LOG_LEVEL value ("" means DefaultLevel).
// Letter case is ignored, as internal/config does.
func ParseLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(s) {
	case "":
		return zapcore.WarnLevel, nil
	case "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "warn":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return 0, fmt.Errorf("%s=%q: unknown log level; accepted values: %s", EnvLevel, s, AcceptedLevels)
}

// parseFormat checks a MEMSCALE_LOG_FORMAT value ("" means DefaultFormat).
func parseFormat(s string) (string, error) {
	switch f := strings.ToLower(s); f {
	case "":
		return DefaultFormat, nil
	case "console", "json":
		return f, nil
	}
	return "", fmt.Errorf("%s=%q: unknown log format; accepted values: %s", EnvFormat, s, AcceptedFormats)
}

// New builds a logger writing to stderr from the values of MEMSCALE_LOG_LEVEL
// and MEMSCALE_LOG_FORMAT ("" selects the default).
func New(level, format string) (*zap.Logger, error) {
	return NewTo(zapcore.Lock(os.Stderr), level, format)
}

// NewTo is New writing to w instead of stderr.
func NewTo(w io.Writer, level, format string) (*zap.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	f, err := parseFormat(format)
	if err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	var encoder zapcore.Encoder
	if f == "json" {
		encoder = zapcore.NewJSONEncoder(enc)
	} else {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		encoder = zapcore.NewConsoleEncoder(enc)
	}
	core := zapcore.NewCore(encoder, zapcore.AddSync(w), lvl)
	return zap.New(core, zap.ErrorOutput(zapcore.Lock(os.Stderr))).Named("memscale"), nil
}

// FromEnv builds the logger from MEMSCALE_LOG_LEVEL and MEMSCALE_LOG_FORMAT.
func FromEnv() (*zap.Logger, error) {
	return New(os.Getenv(EnvLevel), os.Getenv(EnvFormat))
}
