package main

/*
#include <stdint.h>
#include <string.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Batched registration (memscale_dtr_ops): a caller that predicts the ids
// the engine assigns - they run in sequence, and the status block publishes
// the next ones - can queue ops and cross once for many of them. Every
// record is applied exactly as memscale_dtr_op would apply it; the engine
// checks each prediction, so a caller whose count went wrong gets an error
// naming the record, never ids it did not expect.

// Layout of a record of memscale_dtr_ops' frame (see memscale.h).
const (
	recordName       = 0 // name id (memscale_dtr_name)
	recordReleases   = 1 // number of released tensor ids
	recordInputs     = 2 // number of inputs (-1: releases only)
	recordOutputs    = 3 // number of outputs
	recordCost       = 4 // cost_ns
	recordFlags      = 5 // flags
	recordOp         = 6 // the op id the caller expects
	recordFirstOut   = 7 // the id the caller expects for the first output
	recordHeader     = 8
	batchFrameHeader = 2 // n records, cap
)

// nameID returns the id of name on the handle, adding it the first time.
func (d *dtrHandle) nameID(p *C.char) (int64, error) {
	if p == nil {
		return -1, errors.New("name: NULL")
	}
	name := d.internName(p)
	if id, ok := d.nameIDs[name]; ok {
		return id, nil
	}
	if d.nameIDs == nil {
		d.nameIDs = map[string]int64{}
	}
	id := int64(len(d.nameList))
	d.nameList = append(d.nameList, name)
	d.nameIDs[name] = id
	return id, nil
}

// ops is memscale_dtr_ops on a locked handle. Words are read from frame
// only as far as the records say, and the results are written after the
// last record was applied.
func (d *dtrHandle) ops(frame *C.int64_t) (int64, error) {
	if frame == nil {
		return -1, errors.New("frame: NULL")
	}
	hdr := unsafe.Slice(frame, batchFrameHeader)
	n, capacity := int64(hdr[0]), int64(hdr[1])
	switch {
	case n < 0 || n > mostPerFrame:
		return -1, fmt.Errorf("frame[0] = %d records: want 0..%d", n, mostPerFrame)
	case capacity < 0 || capacity > mostPerFrame:
		return -1, fmt.Errorf("frame[1] = %d handed-out slots: want 0..%d", capacity, mostPerFrame)
	}
	at := unsafe.Add(unsafe.Pointer(frame), batchFrameHeader*8)
	for i := range n {
		words, err := d.applyRecord(unsafe.Slice((*C.int64_t)(at), recordHeader), unsafe.Add(at, recordHeader*8))
		if err != nil {
			return -1, fmt.Errorf("record %d of %d: %w", i, n, err)
		}
		at = unsafe.Add(at, (recordHeader+words)*8)
	}
	out := unsafe.Slice(frame, int(1+2*capacity))
	out[0] = C.int64_t(d.handOut(out[1:], capacity))
	return n, nil
}

// applyRecord checks and applies one record whose header is rec and whose
// body starts at body; it returns the length of the body in words.
func (d *dtrHandle) applyRecord(rec []C.int64_t, body unsafe.Pointer) (int64, error) {
	r := opRecord{nRel: int64(rec[recordReleases]), nIn: int64(rec[recordInputs]),
		nOut: int64(rec[recordOutputs]), cost: int64(rec[recordCost]), flags: int64(rec[recordFlags])}
	expectOp, expectOut := int64(rec[recordOp]), int64(rec[recordFirstOut])
	if r.nIn < 0 && (r.nOut != 0 || expectOp != 0 || expectOut != 0) {
		return 0, errors.New("a record of releases only (n_in -1) must have n_out and the expected ids 0")
	}
	if err := r.check(); err != nil {
		return 0, err
	}
	name := "releases"
	if r.nIn >= 0 {
		nameID := int64(rec[recordName])
		if nameID < 0 || nameID >= int64(len(d.nameList)) {
			return 0, fmt.Errorf("name id %d: want one memscale_dtr_name returned (0..%d)", nameID, len(d.nameList)-1)
		}
		name = d.nameList[nameID]
		// The ids are checked before anything is applied: a record the
		// caller numbered wrong changes nothing.
		g := d.eng.Graph()
		if nextOp, nextOut := int64(g.NumOps()), int64(g.NumTensors()); expectOp != nextOp || (r.nOut > 0 && expectOut != nextOut) {
			return 0, fmt.Errorf("op %s would be op %d with first output %d; the caller expected op %d, first output %d "+
				"(its count of ids went wrong: read next_op and next_tensor from the status block after any other call)",
				name, nextOp, nextOut, expectOp, expectOut)
		}
	}
	if _, _, err := d.apply(name, r, unsafe.Slice((*C.int64_t)(body), int(r.words()))); err != nil {
		return 0, fmt.Errorf("op %s: %w", name, err)
	}
	return r.words(), nil
}

//export memscale_go_dtr_name
func memscale_go_dtr_name(h C.int64_t, name *C.char) C.int64_t {
	id := int64(-1)
	withEngine("memscale_dtr_name", h, func(d *dtrHandle) error {
		var err error
		id, err = d.nameID(name)
		return err
	})
	return C.int64_t(id)
}

//export memscale_go_dtr_ops
func memscale_go_dtr_ops(h C.int64_t, frame *C.int64_t) C.int64_t {
	n := int64(-1)
	withEngine("memscale_dtr_ops", h, func(d *dtrHandle) error {
		var err error
		n, err = d.ops(frame)
		return err
	})
	return C.int64_t(n)
}
