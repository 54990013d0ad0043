// Command lincheck says whether a history of operations on a key-value map is linearizable.
//
// It reads a JSON array of operations from stdin, one object each:
//
//	{"client": 3, "kind": "put", "key": "k1", "value": "v", "expected": "",
//	 "call": 1200, "return": 1450, "output": "old", "known": true}
//
// Values are strings and "" stands for an absent key. "call" and "return" are nanoseconds on
// one clock; an operation whose outcome is unknown (its process was killed, or it raised) has
// "known": false and is taken to stay pending until the end of the history. Each kind's
// sequential meaning is in step below. The check is porcupine's, partitioned by key (a map
// is linearizable exactly when each of its keys is).
//
// Prints one JSON line, {"result": "ok" | "illegal" | "unknown", ...}, and exits 0 for ok,
// 1 for illegal (with -visualize, the counterexample is written there as HTML), 2 when the
// check ran out of time and 3 for input it could not read.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

type input struct {
	Kind     string `json:"kind"`
	Key      string `json:"key"`
	Value    string `json:"value"`
	Expected string `json:"expected"`
}

type output struct {
	Known  bool
	Result string // a value ("" absent) or, for the kinds that answer yes or no, "true"/"false"
}

type record struct {
	Client   int    `json:"client"`
	Kind     string `json:"kind"`
	Key      string `json:"key"`
	Value    string `json:"value"`
	Expected string `json:"expected"`
	Call     int64  `json:"call"`
	Return   *int64 `json:"return"`
	Output   string `json:"output"`
	Known    bool   `json:"known"`
}

func truth(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// step is the map's sequential specification for one key: the result each kind returns from
// state, and the state it leaves. kafkakv's ReplicaMap methods, in the same order:
// get/getitem/getdefault (the value), contains (in), put/put_async (the previous value),
// put_blind (a put inside put_all, which reports no per-key result), put_if_absent (the value
// already there, "" when it set), replace (the previous value; sets only if present),
// compare_and_set (whether it set), remove (the previous value), remove_blind (inside
// remove_all), remove_if (whether it removed), compute_append (compute with the tests'
// registered "lin-append", workload.py: the new value). get_versioned and
// compare_version_and_set are in stepVersioned.
func step(state string, in input) (result string, next string, ok bool) {
	switch in.Kind {
	case "get":
		return state, state, true
	case "contains":
		return truth(state != ""), state, true
	case "put":
		return state, in.Value, true
	case "put_blind":
		return "", in.Value, true
	case "put_if_absent":
		if state == "" {
			return "", in.Value, true
		}
		return state, state, true
	case "replace":
		if state == "" {
			return "", "", true
		}
		return state, in.Value, true
	case "compare_and_set":
		if state == in.Expected {
			return "true", in.Value, true
		}
		return "false", state, true
	case "remove":
		return state, "", true
	case "remove_blind":
		return "", "", true
	case "remove_if":
		if state != "" && state == in.Expected {
			return "true", "", true
		}
		return "false", state, true
	case "compute_append":
		next := in.Value
		if state != "" {
			next = state + "+" + in.Value
			if len(next) > 60 {
				next = next[len(next)-60:]
			}
		}
		return next, next, true
	}
	return "", state, false
}

func versioned(kind string) bool {
	return kind == "get_versioned" || kind == "compare_version_and_set"
}

func blind(kind string) bool { return kind == "put_blind" || kind == "remove_blind" }

// keyState is one key's value ("" absent) and, in a map with versions, its version: the
// offset of the record that last changed it, "" while absent, "?" when changed by a write
// whose version no call has shown yet (the first get_versioned to show it binds it).
type keyState struct {
	Value   string
	Version string
}

// stepVersioned is step with versions kept: every write that changes the value gives the key
// a new version (the workload writes a value only once, so every such write changes it);
// get_versioned returns "value@version" ("" absent) and compare_version_and_set sets when
// the key's version is the expected one ("" expects it absent). A version no call has shown
// cannot be the one a caller passes: to pass it, the caller read it first.
func stepVersioned(state keyState, in input, out output) (bool, interface{}) {
	switch in.Kind {
	case "get_versioned":
		if !out.Known {
			return true, state
		}
		if state.Value == "" {
			return out.Result == "", state
		}
		want := state.Value + "@"
		if len(out.Result) <= len(want) || out.Result[:len(want)] != want {
			return false, state
		}
		shown := out.Result[len(want):]
		if state.Version == "?" {
			return true, keyState{state.Value, shown}
		}
		return shown == state.Version, state
	case "compare_version_and_set":
		set := state.Value == "" && in.Expected == "" ||
			state.Value != "" && in.Expected != "" && state.Version == in.Expected
		next := state
		if set {
			next = keyState{in.Value, "?"}
		}
		return !out.Known || out.Result == truth(set), next
	}
	result, value, ok := step(state.Value, in)
	if !ok {
		return false, state
	}
	next := state
	if value != state.Value {
		next = keyState{value, "?"}
		if value == "" {
			next.Version = ""
		}
	}
	if !out.Known || blind(in.Kind) {
		return true, next
	}
	return out.Result == result, next
}

var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(input).Key
			if _, seen := byKey[k]; !seen {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		parts := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, byKey[k])
		}
		return parts
	},
	Init: func() interface{} { return keyState{} },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		return stepVersioned(state.(keyState), in.(input), out.(output))
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		res := o.Result
		if !o.Known {
			res = "?"
		}
		switch i.Kind {
		case "compare_and_set", "remove_if":
			return fmt.Sprintf("%s(%q, %q, %q) -> %s", i.Kind, i.Key, i.Expected, i.Value, res)
		}
		return fmt.Sprintf("%s(%q, %q) -> %q", i.Kind, i.Key, i.Value, res)
	},
	DescribeState: func(state interface{}) string {
		st := state.(keyState)
		return fmt.Sprintf("%q@%s", st.Value, st.Version)
	},
}

func main() {
	visualize := flag.String("visualize", "", "write an illegal history's counterexample here (HTML)")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()

	var records []record
	if err := json.NewDecoder(os.Stdin).Decode(&records); err != nil {
		fmt.Printf("{\"result\": \"error\", \"error\": %q}\n", err.Error())
		os.Exit(3)
	}
	history := make([]porcupine.Operation, 0, len(records))
	for n, r := range records {
		if _, _, ok := step("", input{Kind: r.Kind}); !ok && !versioned(r.Kind) {
			fmt.Printf("{\"result\": \"error\", \"error\": \"operation %d: unknown kind %q\"}\n", n, r.Kind)
			os.Exit(3)
		}
		ret := int64(math.MaxInt64)
		if r.Known {
			if r.Return == nil || *r.Return < r.Call {
				fmt.Printf("{\"result\": \"error\", \"error\": \"operation %d: known, but no return after its call\"}\n", n)
				os.Exit(3)
			}
			ret = *r.Return
		}
		history = append(history, porcupine.Operation{
			ClientId: r.Client,
			Input:    input{Kind: r.Kind, Key: r.Key, Value: r.Value, Expected: r.Expected},
			Call:     r.Call,
			Output:   output{Known: r.Known, Result: r.Output},
			Return:   ret,
		})
	}
	result, info := porcupine.CheckOperationsVerbose(model, history, *timeout)
	switch result {
	case porcupine.Ok:
		fmt.Printf("{\"result\": \"ok\", \"operations\": %d}\n", len(history))
	case porcupine.Illegal:
		where := ""
		if *visualize != "" {
			if err := porcupine.VisualizePath(model, info, *visualize); err == nil {
				where = *visualize
			}
		}
		fmt.Printf("{\"result\": \"illegal\", \"operations\": %d, \"visualization\": %q}\n", len(history), where)
		os.Exit(1)
	default:
		fmt.Printf("{\"result\": \"unknown\", \"operations\": %d}\n", len(history))
		os.Exit(2)
	}
}
