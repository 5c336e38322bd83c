package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// maxSizeText bounds the length of a size string, so that absurd inputs are
// rejected before any arithmetic is done on them.
const maxSizeText = 64

// sizeUnits maps a lower-case unit suffix to its multiplier in bytes.
var sizeUnits = map[string]uint64{
	"":    1,
	"b":   1,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

// SizeSyntax describes the accepted spellings of a byte size; it is part of
// every size error message.
const SizeSyntax = `a byte count ("1073741824"), or a number with a unit: B, KB, MB, GB, TB ` +
	`(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), decimals allowed ` +
	`("1.5GiB", "12 GB"); units are case-insensitive`

// PercentSyntax describes the percentage spelling accepted by sizes relative to
// device memory.
const PercentSyntax = `a percentage of device memory greater than 0 and at most 100 ("75%", "12.5%")`

// ErrSyntax is wrapped by every error ParseSize and ParseSizeOrPercent return.
var ErrSyntax = errors.New("invalid size")

// Size is a byte count or a percentage of device memory. A percentage is
// resolved into bytes by Resolve once the device capacity is known. The zero
// Size is zero bytes.
type Size struct {
	// Bytes is the size in bytes when Percent is 0.
	Bytes uint64 `json:"bytes"`
	// Percent is the share of device memory in (0, 100], or 0 when the size
	// is an absolute byte count.
	Percent float64 `json:"percent,omitempty"`
}

// IsPercent reports whether the size is relative to device memory.
func (s Size) IsPercent() bool { return s.Percent > 0 }

// IsZero reports whether the size is zero bytes (the "not set" value of the
// optional sizes).
func (s Size) IsZero() bool { return s.Percent == 0 && s.Bytes == 0 }

// Resolve returns the size in bytes for a device of total bytes: Bytes, or
// floor(total * Percent / 100).
func (s Size) Resolve(total uint64) uint64 {
	if !s.IsPercent() {
		return s.Bytes
	}
	if s.Percent >= 100 {
		return total
	}
	// Exact rational arithmetic: float64 cannot hold every uint64 total.
	// The shortest decimal form of Percent is what the user wrote.
	p, ok := new(big.Rat).SetString(strconv.FormatFloat(s.Percent, 'f', -1, 64))
	if !ok {
		p = new(big.Rat).SetFloat64(s.Percent)
	}
	r := new(big.Rat).Mul(new(big.Rat).SetInt(new(big.Int).SetUint64(total)), p)
	r.Quo(r, big.NewRat(100, 1))
	q := new(big.Int).Quo(r.Num(), r.Denom())
	return q.Uint64()
}

// String renders the size the way it would be written in the environment:
// "75%" or a plain byte count.
func (s Size) String() string {
	if s.IsPercent() {
		return strconv.FormatFloat(s.Percent, 'f', -1, 64) + "%"
	}
	return strconv.FormatUint(s.Bytes, 10)
}

// ParseSize parses an absolute byte size: a plain byte count or a decimal
// number followed by one of the units B, KB, MB, GB, TB (powers of 1000) or
// KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, with optional spaces
// between number and unit. Fractions are allowed with a unit larger than a byte
// and the result is rounded down to whole bytes; signs, exponents and values
// above 2^64-1 bytes are rejected.
func ParseSize(text string) (uint64, error) {
	s := strings.TrimSpace(text)
	if s == "" {
		return 0, fmt.Errorf("%w: empty", ErrSyntax)
	}
	if len(s) > maxSizeText {
		return 0, fmt.Errorf("%w: longer than %d characters", ErrSyntax, maxSizeText)
	}
	if strings.HasSuffix(s, "%") {
		return 0, fmt.Errorf("%w: %q is a percentage; an absolute size is needed here", ErrSyntax, s)
	}
	intPart, fracPart, unit, err := splitNumber(s)
	if err != nil {
		return 0, err
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("%w: unknown unit %q", ErrSyntax, unit)
	}
	if fracPart != "" && mult == 1 {
		return 0, fmt.Errorf("%w: %q is a fraction of a byte", ErrSyntax, s)
	}
	n, ok := new(big.Int).SetString(intPart+fracPart, 10)
	if !ok {
		return 0, fmt.Errorf("%w: %q is not a number", ErrSyntax, s)
	}
	n.Mul(n, new(big.Int).SetUint64(mult))
	if fracPart != "" {
		n.Quo(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(fracPart))), nil))
	}
	if !n.IsUint64() {
		return 0, fmt.Errorf("%w: %q is more than %d bytes", ErrSyntax, s, uint64(math.MaxUint64))
	}
	return n.Uint64(), nil
}

// ParseSizeOrPercent parses what ParseSize accepts, or a percentage of device
// memory ("75%", "12.5%") in (0, 100].
func ParseSizeOrPercent(text string) (Size, error) {
	s := strings.TrimSpace(text)
	if num, ok := strings.CutSuffix(s, "%"); ok {
		p, err := parsePercent(strings.TrimSpace(num))
		if err != nil {
			return Size{}, err
		}
		return Size{Percent: p}, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return Size{}, err
	}
	return Size{Bytes: n}, nil
}

// parsePercent parses the number of a percentage (without the % sign).
func parsePercent(num string) (float64, error) {
	if len(num) > maxSizeText {
		return 0, fmt.Errorf("%w: longer than %d characters", ErrSyntax, maxSizeText)
	}
	intPart, fracPart, rest, err := splitNumber(num)
	if err != nil {
		return 0, err
	}
	if rest != "" {
		return 0, fmt.Errorf("%w: %q is not a plain percentage", ErrSyntax, num+"%")
	}
	digits := intPart
	if fracPart != "" {
		digits += "." + fracPart
	}
	p, err := strconv.ParseFloat(digits, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %w", ErrSyntax, num+"%", err)
	}
	if p <= 0 || p > 100 {
		return 0, fmt.Errorf("%w: %s%% is outside (0%%, 100%%]", ErrSyntax, num)
	}
	return p, nil
}

// splitNumber splits s into the digits before the decimal point, the digits
// after it (empty when there is no point) and the rest (the unit, with leading
// spaces removed). The number must start with a digit and a point must be
// followed by at least one digit.
func splitNumber(s string) (intPart, fracPart, rest string, err error) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if i == 0 {
		switch {
		case s == "":
			return "", "", "", fmt.Errorf("%w: empty number", ErrSyntax)
		case s[0] == '-':
			return "", "", "", fmt.Errorf("%w: %q is negative", ErrSyntax, s)
		default:
			return "", "", "", fmt.Errorf("%w: %q does not start with a digit", ErrSyntax, s)
		}
	}
	intPart = s[:i]
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		if j == i+1 {
			return "", "", "", fmt.Errorf("%w: %q has no digits after the decimal point", ErrSyntax, s)
		}
		fracPart = s[i+1 : j]
		i = j
	}
	rest = strings.TrimLeft(s[i:], " \t")
	return intPart, fracPart, rest, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
