package recompute

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// normalize is what a packed trace keeps of an instruction (Trace.Append):
// the fields its kind uses, empty slices as nil, the line clamped.
func normalize(in Instr) Instr {
	switch in.Kind {
	case KindConstant:
		in.Time = 0
	case KindCall, KindMutate:
		in.Size = 0
	default:
		in.Size, in.Time = 0, 0
	}
	in.Line = min(max(in.Line, 0), math.MaxInt32)
	in.Args = append([]int32(nil), in.Args...)
	in.Outs = append([]Out(nil), in.Outs...)
	in.Mutated = append([]int32(nil), in.Mutated...)
	if len(in.Args) == 0 {
		in.Args = nil
	}
	if len(in.Outs) == 0 {
		in.Outs = nil
	}
	if len(in.Mutated) == 0 {
		in.Mutated = nil
	}
	return in
}

func randomInstr(r *rand.Rand) Instr {
	kinds := []Kind{KindConstant, KindCall, KindMutate, KindCopy, KindCopyFrom, KindRelease, KindAnnotate, KindPin}
	names := []string{"", "aten::mm", "aten::add", "BACKWARD", "x"}
	in := Instr{Kind: kinds[r.IntN(len(kinds))], Line: r.IntN(1000), Op: names[r.IntN(len(names))],
		T: r.Int32N(100), Old: r.Int32N(100), Size: r.Uint64(), Time: r.Int64()}
	if r.IntN(50) == 0 {
		in.Line = math.MaxInt32 + r.IntN(10)
	}
	for range r.IntN(4) {
		in.Args = append(in.Args, r.Int32())
	}
	for range r.IntN(3) {
		in.Outs = append(in.Outs, Out{Size: r.Uint64(), T: r.Int32(), Alias: r.Int32N(4) - 1})
	}
	for range r.IntN(3) {
		in.Mutated = append(in.Mutated, r.Int32N(4))
	}
	if r.IntN(4) == 0 {
		in.Args = []int32{} // empty, not nil
	}
	return in
}

// TestPackedMatchesSlice appends random instructions to a Trace and to a
// plain slice (the reference) and checks that every read gives back what
// the slice holds, that the caller's slices are copied, and that a clipped
// copy (Builder.Trace) and its original never see each other's appends.
func TestPackedMatchesSlice(t *testing.T) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		var tr Trace
		var ref []Instr
		for range r.IntN(300) {
			in := randomInstr(r)
			require.NoError(t, tr.Append(in))
			ref = append(ref, normalize(in))
			if len(in.Args) > 0 {
				in.Args[0]++ // the trace copied them
			}
		}
		require.Equal(t, len(ref), tr.Len())
		for i := range ref {
			require.Equal(t, ref[i], tr.At(i), "seed %d instruction %d", seed, i)
		}
		n := 0
		for i, in := range tr.All() {
			require.Equal(t, ref[i], in)
			n++
		}
		require.Equal(t, len(ref), n)
		if len(ref) > 0 {
			require.Equal(t, ref, tr.Instructions())
		}
		tr.compact()
		for i := range ref {
			require.Equal(t, ref[i], tr.At(i))
		}
		// a clipped copy and the original go on separately
		c := tr.clip()
		a, b := randomInstr(r), randomInstr(r)
		require.NoError(t, tr.Append(a))
		require.NoError(t, c.Append(b))
		require.Equal(t, normalize(a), tr.At(len(ref)))
		require.Equal(t, normalize(b), c.At(len(ref)))
		for i := range ref {
			require.Equal(t, ref[i], tr.At(i))
			require.Equal(t, ref[i], c.At(i))
		}
	}
}
