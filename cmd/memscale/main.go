// Command memscale is the memscale command line: device information, trace
// replay, benchmarks and snapshot rendering, one subcommand each.
//
//	memscale help            list the subcommands
//	memscale info [--json]   GPUs (via NVML), the backend auto would choose, the sim config
//
// Each subcommand lives in its own file and registers itself from an init
// function with register; main only dispatches.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is one subcommand.
type command struct {
	// name is what the user types ("info").
	name string
	// summary is a one-line description for `memscale help`.
	summary string
	// run executes the command with the arguments after its name. Output goes
	// to stdout, diagnostics to stderr. A returned flag.ErrHelp means help was
	// printed; a usageError means bad arguments (exit status 2).
	run func(args []string, stdout, stderr io.Writer) error
}

// commands holds the subcommands. It is filled by register from init
// functions only, before main runs, and read-only afterwards.
var commands = map[string]command{}

// register adds a subcommand; it is called from init functions.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic(fmt.Sprintf("memscale: subcommand %q registered twice", c.name))
	}
	commands[c.name] = c
}

// usageError reports bad command-line arguments (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// usagef returns a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// newFlagSet returns a flag set for subcommand name whose errors are returned
// rather than printed twice, and whose -h output goes to stdout.
func newFlagSet(name, synopsis string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "usage: memscale %s\n", synopsis)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args into fs, mapping errors to usageError (flag.ErrHelp
// is returned as is).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	return nil
}

// parseInterleaved parses args with fs, flags and positional arguments in
// any order (flag.Parse stops at the first positional); returns the
// positionals in order.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return positional, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// printHelp lists the subcommands.
func printHelp(w io.Writer) {
	names := make([]string, 0, len(commands))
	width := 4
	for n := range commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	fmt.Fprintf(w, "usage: memscale <command> [arguments]\n\ncommands:\n")
	fmt.Fprintf(w, "  %-*s  %s\n", width, "help", "list the commands")
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'memscale <command> -h' for the command's flags.\n")
}

// run dispatches a command line and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printHelp(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return finish(c.name, c.run([]string{"-h"}, stdout, stderr), stderr)
			}
			fmt.Fprintf(stderr, "memscale help: unknown command %q\n\n", args[1])
			printHelp(stderr)
			return 2
		}
		printHelp(stdout)
		return 0
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "memscale: error: unknown command %q (known: %s; see 'memscale --help')\n",
			name, strings.Join(commandNames(), ", "))
		return 2
	}
	return finish(name, c.run(args[1:], stdout, stderr), stderr)
}

// finish reports a command's error and returns the exit status.
func finish(name string, err error, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "memscale: error: %s: %s (see 'memscale %s -h')\n", name, oneLine(err), name)
		return 2
	default:
		fmt.Fprintf(stderr, "memscale: error: %s: %s\n", name, oneLine(err))
		return 1
	}
}

// oneLine is err's message on one line: an error reaching the command line
// is one line, whatever it wraps.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// commandNames returns the sorted subcommand names, help included.
func commandNames() []string {
	names := []string{"help"}
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
