package main

import (
	"fmt"
	"io"
	"os"
)

// outputOrder is the order in which output files are opened and written
// (the flag names).
var outputOrder = []string{"csv", "json", "markdown", "plot"}

// outputFiles are output files opened before a long run, so that a bad path
// fails first; files not completed are removed.
type outputFiles map[string]*os.File

func openOutputs(paths map[string]string) (outputFiles, error) {
	outs := outputFiles{}
	for _, flag := range outputOrder {
		p := paths[flag]
		if p == "" {
			continue
		}
		f, err := os.Create(p)
		if err != nil {
			outs.abort()
			return nil, fmt.Errorf("--%s: %w", flag, err)
		}
		outs[flag] = f
	}
	return outs, nil
}

// write fills and closes each open file with its writer.
func (o outputFiles) write(writers map[string]func(io.Writer) error) error {
	for _, flag := range outputOrder {
		f, ok := o[flag]
		if !ok {
			continue
		}
		if err := writers[flag](f); err != nil {
			return fmt.Errorf("--%s %s: %w", flag, f.Name(), err)
		}
		err := f.Close()
		delete(o, flag)
		if err != nil {
			return fmt.Errorf("--%s: %w", flag, err)
		}
	}
	return nil
}

// abort closes and removes the files not completed.
func (o outputFiles) abort() {
	for k, f := range o {
		f.Close()
		os.Remove(f.Name())
		delete(o, k)
	}
}
