// Package plot draws memscale's charts as PNG images with gonum.org/v1/plot:
// line charts of one value against another, one line per series, several
// panels in a grid sharing one legend. Points without a value (an
// infeasible run) break their line and are marked by a cross in a strip
// above the panel's ceiling, one row per series.
package plot

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"sort"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Point is one data point.
type Point struct {
	// X and Y are the coordinates; Y is ignored when Missing is set.
	X, Y float64
	// Missing marks a point without a value (e.g. an infeasible run).
	Missing bool
}

// Series is one line of a panel. Series of the same name share a colour,
// a glyph and one legend entry across panels.
type Series struct {
	// Name labels the line in the legend.
	Name string
	// Points are joined in order; missing points break the line.
	Points []Point
}

// Panel is one chart.
type Panel struct {
	// Title is drawn above the chart.
	Title string
	// Series are the lines.
	Series []Series
}

// Options lay out the image.
type Options struct {
	// XLabel and YLabel label the axes.
	XLabel, YLabel string
	// XMin, XMax fix the X range when XMax > XMin; otherwise it fits the data.
	XMin, XMax float64
	// YMin is the bottom of the Y axis when FixYMin is set; otherwise the
	// axis fits the data.
	YMin    float64
	FixYMin bool
	// Ceiling is the Y value above which missing points are marked (e.g.
	// the overhead limit); 0 = the highest value of the panel.
	Ceiling float64
	// MissingLabel names the missing-point marker in the legend.
	MissingLabel string
	// Palette lists series names in the order that picks their colour and
	// glyph, so that a name looks the same in every image; names not in it
	// come after, in order of appearance. Only the names present are in
	// the legend.
	Palette []string
	// Columns is the number of panels per row (0 = up to 3).
	Columns int
	// PanelWidth and PanelHeight are each panel's size in pixels (0 = 560
	// by 420); LegendWidth is the legend column's (0 = 230).
	PanelWidth, PanelHeight, LegendWidth int
}

// palette holds distinct, readable line colours (one per series name,
// wrapping).
var palette = [...]color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
	{188, 189, 34, 255}, {23, 190, 207, 255},
}

// glyphs are the point shapes (one per series name, wrapping); the cross is
// kept for missing points.
var glyphs = [...]draw.GlyphDrawer{
	draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.RingGlyph{},
	draw.BoxGlyph{}, draw.PyramidGlyph{}, draw.PlusGlyph{},
}

const dpi = 96

// px converts pixels to a length at the image's resolution.
func px(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }

// style is how one series name is drawn.
type style struct {
	line  draw.LineStyle
	glyph draw.GlyphStyle
	miss  draw.GlyphStyle
	row   int // row of the missing-point strip
}

// WritePNG draws panels in a grid, with one legend column on the right,
// and writes the PNG image to w.
func WritePNG(w io.Writer, panels []Panel, opt Options) error {
	if len(panels) == 0 {
		return errors.New("plot: no panels")
	}
	cols := opt.Columns
	if cols <= 0 {
		cols = min(len(panels), 3)
	}
	rows := (len(panels) + cols - 1) / cols
	pw, ph, lw := opt.PanelWidth, opt.PanelHeight, opt.LegendWidth
	if pw <= 0 {
		pw = 560
	}
	if ph <= 0 {
		ph = 420
	}
	if lw <= 0 {
		lw = 230
	}

	styles, names := styleSet(panels, opt.Palette)

	grid := make([][]*gplot.Plot, rows)
	for r := range grid {
		grid[r] = make([]*gplot.Plot, cols)
	}
	anyMissing := false
	for i, p := range panels {
		pl, missing, err := panelPlot(p, opt, styles, len(names))
		if err != nil {
			return fmt.Errorf("plot: panel %q: %w", p.Title, err)
		}
		anyMissing = anyMissing || missing
		grid[i/cols][i%cols] = pl
	}

	img := vgimg.NewWith(vgimg.UseWH(px(pw*cols+lw), px(ph*rows)), vgimg.UseDPI(dpi),
		vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	plots := draw.Crop(dc, 0, -px(lw), 0, 0)
	pad := vg.Points(6)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadTop: pad, PadBottom: pad, PadLeft: pad, PadRight: pad, PadX: 2 * pad, PadY: 2 * pad}
	canvases := gplot.Align(grid, tiles, plots)
	for r := range grid {
		for c, pl := range grid[r] {
			if pl != nil {
				pl.Draw(canvases[r][c])
			}
		}
	}

	leg := gplot.NewLegend()
	leg.Top, leg.Left = true, true
	for _, n := range names {
		st := styles[n]
		leg.Add(n, icon{line: st.line, glyph: st.glyph})
	}
	if anyMissing && opt.MissingLabel != "" {
		leg.Add(opt.MissingLabel, icon{glyph: draw.GlyphStyle{Color: color.Black, Radius: vg.Points(3), Shape: draw.CrossGlyph{}}})
	}
	leg.Draw(draw.Crop(dc, dc.Max.X-dc.Min.X-px(lw)+2*pad, 0, 0, -3*pad))

	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("plot: writing PNG: %w", err)
	}
	return nil
}

// styleSet gives every series name a style: the names of order first (by
// position), then the others by first appearance. It returns the styles and
// the names present, in legend order.
func styleSet(panels []Panel, order []string) (map[string]*style, []string) {
	// One style per series name: the palette order first, then the order
	// of first appearance.
	slot := map[string]int{}
	for _, n := range order {
		if _, ok := slot[n]; !ok {
			slot[n] = len(slot)
		}
	}
	styles := map[string]*style{}
	var names []string
	for _, p := range panels {
		for _, s := range p.Series {
			if _, ok := styles[s.Name]; ok {
				continue
			}
			i, ok := slot[s.Name]
			if !ok {
				i = len(slot)
				slot[s.Name] = i
			}
			col := palette[i%len(palette)]
			styles[s.Name] = &style{
				line:  draw.LineStyle{Color: col, Width: vg.Points(1.5)},
				glyph: draw.GlyphStyle{Color: col, Radius: vg.Points(3), Shape: glyphs[i%len(glyphs)]},
				miss:  draw.GlyphStyle{Color: col, Radius: vg.Points(3), Shape: draw.CrossGlyph{}},
			}
			names = append(names, s.Name)
		}
	}
	// The strip rows of missing points follow the legend order.
	sort.SliceStable(names, func(a, b int) bool { return slot[names[a]] < slot[names[b]] })
	for i, n := range names {
		styles[n].row = i
	}

	return styles, names
}

// panelPlot builds one panel; it reports whether any point was missing.
func panelPlot(p Panel, opt Options, styles map[string]*style, nstyles int) (*gplot.Plot, bool, error) {
	pl := gplot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = opt.XLabel
	pl.Y.Label.Text = opt.YLabel
	pl.Add(plotter.NewGrid())

	top, bottom := math.Inf(-1), math.Inf(1)
	anyMissing := false
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if bad(pt.X) || (!pt.Missing && bad(pt.Y)) {
				return nil, false, fmt.Errorf("series %q: non-finite point (%v, %v)", s.Name, pt.X, pt.Y)
			}
			if pt.Missing {
				anyMissing = true
			} else {
				top, bottom = math.Max(top, pt.Y), math.Min(bottom, pt.Y)
			}
		}
	}
	if opt.FixYMin {
		bottom = opt.YMin
	}
	ceiling := opt.Ceiling
	if ceiling == 0 {
		ceiling = top
	}
	if math.IsInf(ceiling, -1) { // nothing but missing points
		ceiling = 1
	}
	if math.IsInf(bottom, 1) {
		bottom = ceiling - 1
	}
	// The strip of missing points: one row per series name above the
	// ceiling.
	step := math.Max(ceiling-bottom, 1e-9) * 0.035

	for _, s := range p.Series {
		st := styles[s.Name]
		var seg, pts, miss plotter.XYs
		flush := func() error {
			if len(seg) > 1 {
				l, err := plotter.NewLine(seg)
				if err != nil {
					return err
				}
				l.LineStyle = st.line
				pl.Add(l)
			}
			seg = nil
			return nil
		}
		for _, pt := range s.Points {
			if pt.Missing {
				if err := flush(); err != nil {
					return nil, false, err
				}
				miss = append(miss, plotter.XY{X: pt.X, Y: ceiling + float64(st.row+1)*step})
				continue
			}
			seg = append(seg, plotter.XY{X: pt.X, Y: pt.Y})
			pts = append(pts, plotter.XY{X: pt.X, Y: pt.Y})
		}
		if err := flush(); err != nil {
			return nil, false, err
		}
		for _, set := range []struct {
			xys   plotter.XYs
			glyph draw.GlyphStyle
		}{{pts, st.glyph}, {miss, st.miss}} {
			if len(set.xys) == 0 {
				continue
			}
			sc, err := plotter.NewScatter(set.xys)
			if err != nil {
				return nil, false, err
			}
			sc.GlyphStyle = set.glyph
			pl.Add(sc)
		}
	}
	if anyMissing {
		// the ceiling itself, dashed
		l, err := plotter.NewLine(plotter.XYs{{X: opt.XMin, Y: ceiling}, {X: opt.XMax, Y: ceiling}})
		if err != nil {
			return nil, false, err
		}
		l.LineStyle = draw.LineStyle{Color: color.Gray{Y: 120}, Width: vg.Points(0.75), Dashes: []vg.Length{vg.Points(3), vg.Points(3)}}
		if opt.XMax > opt.XMin {
			pl.Add(l)
		}
		pl.Y.Max = math.Max(pl.Y.Max, ceiling+float64(nstyles+1)*step)
	}
	if opt.XMax > opt.XMin {
		pl.X.Min, pl.X.Max = opt.XMin, opt.XMax
	}
	if opt.FixYMin {
		pl.Y.Min = opt.YMin
		pl.Y.Max = math.Max(pl.Y.Max, opt.YMin+1e-9)
	}
	return pl, anyMissing, nil
}

func bad(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }

// icon draws a legend entry: a short line (when it has a colour) with the
// glyph in its middle.
type icon struct {
	line  draw.LineStyle
	glyph draw.GlyphStyle
}

// Thumbnail implements plot.Thumbnailer.
func (l icon) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	if l.line.Color != nil {
		c.StrokeLine2(l.line, c.Min.X, y, c.Max.X, y)
	}
	c.DrawGlyph(l.glyph, vg.Point{X: c.Center().X, Y: y})
}
