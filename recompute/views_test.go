package recompute

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStorageTensorsMatchReference drives a graph with random externals,
// ops with fresh and view outputs (views of views included), drops,
// re-runs and releases, and checks it against a reference model kept
// beside it: per storage the list of its tensors (root first, views in
// the order made) and per tensor whether it is defined. The graph links a
// storage's views through its tensors instead of holding a slice each.
func TestStorageTensorsMatchReference(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 11))
		g := NewGraph()
		var refTensors [][]TensorID // storage -> tensors
		var refDefined []bool       // tensor -> defined
		var refStorage []StorageID  // tensor -> storage
		resident := func() []TensorID {
			var out []TensorID
			for x := range refDefined {
				if g.IsResident(TensorID(x)) {
					out = append(out, TensorID(x))
				}
			}
			return out
		}
		for step := 0; step < 200; step++ {
			switch k := r.IntN(10); {
			case k < 2 || len(refDefined) == 0:
				x, err := g.AddExternal(uint64(r.IntN(100)), int64(step))
				require.NoError(t, err)
				refStorage = append(refStorage, StorageID(len(refTensors)))
				refTensors = append(refTensors, []TensorID{x})
				refDefined = append(refDefined, true)
			case k < 7:
				res := resident()
				if len(res) == 0 {
					continue
				}
				ins := make([]TensorID, 1+r.IntN(3))
				for i := range ins {
					ins[i] = res[r.IntN(len(res))]
				}
				outs := make([]OutSpec, 1+r.IntN(3))
				for i := range outs {
					outs[i] = OutSpec{Size: uint64(r.IntN(100)), Alias: -1}
					if r.IntN(2) == 0 {
						outs[i].Alias = int32(r.IntN(len(ins)))
					}
				}
				op, err := g.AddOp("f", ins, outs, 1, 0, int64(step))
				require.NoError(t, err)
				for i, o := range outs {
					x := g.Op(op).Outputs[i]
					require.Equal(t, TensorID(len(refDefined)), x)
					refDefined = append(refDefined, true)
					if o.Alias < 0 {
						refStorage = append(refStorage, StorageID(len(refTensors)))
						refTensors = append(refTensors, []TensorID{x})
					} else {
						s := refStorage[ins[o.Alias]]
						refStorage = append(refStorage, s)
						refTensors[s] = append(refTensors[s], x)
					}
				}
			case k < 9:
				s := StorageID(r.IntN(len(refTensors)))
				if g.Storage(s).State != Resident {
					continue
				}
				g.Drop(s)
				for _, x := range refTensors[s] {
					refDefined[x] = false
				}
			default:
				s := StorageID(r.IntN(len(refTensors)))
				g.Release(s)
				for _, x := range refTensors[s] {
					refDefined[x] = false
				}
			}
			for s, want := range refTensors {
				require.Equal(t, want, g.StorageTensors(StorageID(s), nil), "seed %d step %d storage %d", seed, step, s)
				require.Equal(t, want[0], g.Storage(StorageID(s)).Root)
			}
			for x, d := range refDefined {
				require.Equal(t, d, g.Tensor(TensorID(x)).Defined, "seed %d step %d tensor %d", seed, step, x)
				require.Equal(t, refStorage[x], g.Tensor(TensorID(x)).Storage)
			}
		}
	}
}
