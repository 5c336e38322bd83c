package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPlanCommandErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan"}, "no trace given"},
		{[]string{"plan", tinyTrace, "--budgets", "24XB"}, `--budgets: "24XB"`},
		{[]string{"plan", tinyTrace, "--budgets", "0"}, "want sizes such as 24GiB"},
		{[]string{"plan", tinyTrace, "--device", "v100"}, `unknown device "v100"`},
		{[]string{"plan", tinyTrace, "--batch-sizes", "8,x"}, `"x" is not a positive integer`},
		{[]string{"plan", tinyTrace, "--batch-sizes", "8,16"}, "2 sizes for 1 traces"},
		{[]string{"plan", "/nonexistent/step.log.gz"}, "want a trace recorded by memscale.plan"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		assert.NotEqual(t, 0, code, "%v", tc.args)
		assert.Contains(t, errb.String(), tc.want, "%v", tc.args)
		assert.Equal(t, 1, bytes.Count(errb.Bytes(), []byte("\n")), "one line: %q", errb.String())
	}
}

func TestPlanCommandJSONAndPlot(t *testing.T) {
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "plan.json"), filepath.Join(dir, "plan.png")
	second := filepath.Join(dir, "tiny16.log") // the same step, as if at batch 16
	b, err := os.ReadFile(tinyTrace)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(second, b, 0o644))
	var out, errb bytes.Buffer
	code := run([]string{"plan", tinyTrace, second, "--batch-sizes", "8,16", "--budgets", "1KB", "--device", "l4",
		"--json", jsonPath, "--plot", plotPath, "--jobs", "1"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), "== plan: tiny")
	assert.Contains(t, out.String(), "largest batch: natively 16")
	var doc struct {
		Plans []struct {
			Summary  string           `json:"summary"`
			Variants []map[string]any `json:"variants"`
		} `json:"plans"`
		Batches []map[string]any `json:"batches"`
	}
	b, err = os.ReadFile(jsonPath)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Plans, 2)
	assert.Contains(t, doc.Plans[0].Variants[0]["violates"], "violates_1KB")
	require.Len(t, doc.Batches, 1)
	st, err := os.Stat(plotPath)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(1000))
}

func TestPlanListDevices(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"plan", "--list-devices", "--json", "-"}, &out, &errb), errb.String())
	var ds []map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &ds))
	assert.Len(t, ds, 6)
}
