package recompute

// idArena hands out the small id slices a graph keeps per op and per storage
// (an op's inputs and outputs, a storage's first parent and child) from
// shared chunks: one allocation per chunk rather than two to four per op,
// and fewer small objects for the garbage collector to scan. Every slice it
// hands out has its capacity capped at its length, so an append to one
// copies it to the heap and never reaches its neighbours; a chunk is freed
// with the last slice in it (with the graph).
type idArena[T TensorID | StorageID] struct {
	chunk []T // the current chunk's unused tail
}

// arenaChunk is the number of ids per chunk (32 KiB of TensorIDs).
const arenaChunk = 4096

// take returns a slice of n zero ids, capacity n.
func (a *idArena[T]) take(n int) []T {
	if n == 0 {
		return nil
	}
	if n > len(a.chunk) {
		if n > arenaChunk/4 {
			return make([]T, n) // large: its own allocation, the chunk kept
		}
		a.chunk = make([]T, arenaChunk)
	}
	s := a.chunk[:n:n]
	a.chunk = a.chunk[n:]
	return s
}

// clone returns a copy of ids from the arena.
func (a *idArena[T]) clone(ids []T) []T {
	s := a.take(len(ids))
	copy(s, ids)
	return s
}

// appendTo appends v to s; a first element goes into the arena (capacity
// one), later ones grow s on the heap as append does.
func (a *idArena[T]) appendTo(s []T, v T) []T {
	if cap(s) == 0 {
		s = a.take(1)
		s[0] = v
		return s
	}
	return append(s, v)
}
