package plot

import (
	"bytes"
	"image"
	"image/png"
	"io"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func samplePanels() []Panel {
	return []Panel{
		{Title: "a", Series: []Series{
			{Name: "dtr", Points: []Point{{X: 0.2, Missing: true}, {X: 0.4, Y: 1.5}, {X: 0.6, Y: 1.2}, {X: 0.8, Y: 1.05}}},
			{Name: "lru", Points: []Point{{X: 0.2, Missing: true}, {X: 0.4, Missing: true}, {X: 0.6, Y: 1.4}, {X: 0.8, Missing: true}}},
		}},
		{Title: "b", Series: []Series{
			{Name: "lru", Points: []Point{{X: 0.5, Y: 1.1}}},
			{Name: "msps", Points: []Point{{X: 0.5, Y: 1.3}, {X: 0.9, Y: 1.01}}},
		}},
		{Title: "c: nothing feasible", Series: []Series{
			{Name: "dtr", Points: []Point{{X: 0.1, Missing: true}}},
		}},
		{Title: "d: empty"},
	}
}

func decode(t *testing.T, b []byte) image.Image {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	require.NoError(t, err)
	return img
}

func TestWritePNG(t *testing.T) {
	opt := Options{XLabel: "ratio", YLabel: "overhead", XMin: 0, XMax: 1, YMin: 1, FixYMin: true, Ceiling: 2,
		MissingLabel: "infeasible", PanelWidth: 300, PanelHeight: 200, LegendWidth: 100}
	var b bytes.Buffer
	require.NoError(t, WritePNG(&b, samplePanels(), opt))
	img := decode(t, b.Bytes())
	// 4 panels: 3 columns, 2 rows, plus the legend column
	assert.Equal(t, 3*300+100, img.Bounds().Dx())
	assert.Equal(t, 2*200, img.Bounds().Dy())
	assert.False(t, uniform(img), "something was drawn")

	// defaults: one panel, 560x420 plus 230
	b.Reset()
	require.NoError(t, WritePNG(&b, samplePanels()[:1], Options{}))
	img = decode(t, b.Bytes())
	assert.Equal(t, 560+230, img.Bounds().Dx())
	assert.Equal(t, 420, img.Bounds().Dy())

	// two columns asked for
	b.Reset()
	opt.Columns = 2
	require.NoError(t, WritePNG(&b, samplePanels(), opt))
	img = decode(t, b.Bytes())
	assert.Equal(t, 2*300+100, img.Bounds().Dx())
	assert.Equal(t, 2*200, img.Bounds().Dy())
}

func uniform(img image.Image) bool {
	b := img.Bounds()
	first := img.At(b.Min.X, b.Min.Y)
	r0, g0, b0, _ := first.RGBA()
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bb, _ := img.At(x, y).RGBA()
			if r != r0 || g != g0 || bb != b0 {
				return false
			}
		}
	}
	return true
}

func TestWritePNGErrors(t *testing.T) {
	var b bytes.Buffer
	err := WritePNG(&b, nil, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no panels")

	bad := []Panel{{Title: "p", Series: []Series{{Name: "s", Points: []Point{{X: 0.5, Y: math.NaN()}}}}}}
	err = WritePNG(&b, bad, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `panel "p": series "s": non-finite point`)

	// a NaN Y is fine on a missing point
	ok := []Panel{{Title: "p", Series: []Series{{Name: "s", Points: []Point{{X: 0.5, Y: math.NaN(), Missing: true}}}}}}
	require.NoError(t, WritePNG(io.Discard, ok, Options{}))

	err = WritePNG(failWriter{}, samplePanels(), Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "writing PNG")
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestStyleSet(t *testing.T) {
	panels := []Panel{
		{Series: []Series{{Name: "msps"}, {Name: "zeta"}}},
		{Series: []Series{{Name: "dtr"}, {Name: "msps"}, {Name: "omega"}}},
	}
	styles, names := styleSet(panels, []string{"dtr", "dtr-eq", "msps"})
	assert.Equal(t, []string{"dtr", "msps", "zeta", "omega"}, names, "palette order, then appearance")
	assert.Equal(t, palette[0], styles["dtr"].line.Color)
	assert.Equal(t, palette[2], styles["msps"].line.Color, "msps keeps its palette slot although dtr-eq is absent")
	assert.Equal(t, palette[3], styles["zeta"].line.Color)
	assert.Equal(t, palette[4], styles["omega"].line.Color)
	for i, n := range names {
		assert.Equal(t, i, styles[n].row, "strip rows follow the legend")
	}

	styles, names = styleSet(panels, nil)
	assert.Equal(t, []string{"msps", "zeta", "dtr", "omega"}, names)
	assert.Equal(t, palette[0], styles["msps"].line.Color)
}
