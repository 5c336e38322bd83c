// Package bytesize formats byte counts for people: "512 B", "2.0 MiB",
// "16.00 GiB". Parsing sizes from configuration is internal/config's job.
package bytesize

import "fmt"

// Format formats n with a binary unit (KiB .. PiB) and the given number of
// decimals; counts below 1 KiB are printed exactly ("512 B").
func Format(n uint64, decimals int) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.*f %ciB", decimals, float64(n)/float64(div), "KMGTP"[exp])
}
