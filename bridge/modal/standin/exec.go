package main

// One exec in a sandbox: a bwrap process group whose stdin is fed at
// offsets (TaskExecStdinWrite) and whose output is kept whole so a reader
// can start, or start again, at any offset (TaskExecStdioRead).

import (
	"context"
	"io"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type output struct {
	mu     sync.Mutex
	data   []byte
	closed bool
	wake   chan struct{} // closed and replaced on every change
}

func newOutput() *output { return &output{wake: make(chan struct{})} }

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	o.data = append(o.data, p...)
	close(o.wake)
	o.wake = make(chan struct{})
	o.mu.Unlock()
	return len(p), nil
}

func (o *output) close() {
	o.mu.Lock()
	if !o.closed {
		o.closed = true
		close(o.wake)
		o.wake = make(chan struct{})
	}
	o.mu.Unlock()
}

// from returns what lies past off (at most max bytes), whether the stream
// has ended there, and a channel to wait on for more.
func (o *output) from(off uint64, max int) ([]byte, bool, chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if off < uint64(len(o.data)) {
		end := min(uint64(len(o.data)), off+uint64(max))
		return o.data[off:end], false, o.wake
	}
	return nil, o.closed, o.wake
}

type execution struct {
	id       string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	stdinMu  sync.Mutex
	written  uint64
	eof      bool
	out, err *output
	exited   chan struct{}
	code     *int32 // set once exited
	signal   *int32
	timedOut bool
}

func (w *world) startExec(sb *sandbox, id string, args []string, workdir string, env map[string]string,
	timeout uint32, stdout, stderr bool) (*execution, error) {
	if len(args) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no command")
	}
	e := &execution{id: id, out: newOutput(), err: newOutput(), exited: make(chan struct{})}
	argv := w.argv(sb, args, workdir)
	cmd := exec.Command(argv[0], argv[1:]...)
	vars := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": "/root", "MODAL_SANDBOX_ID": sb.id, "MODAL_TASK_ID": sb.taskID}
	for k, v := range sb.env {
		vars[k] = v
	}
	for k, v := range env {
		vars[k] = v
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+vars[k])
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if stdout {
		cmd.Stdout = e.out
	}
	if stderr {
		cmd.Stderr = e.err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	e.stdin = in
	w.mu.Lock()
	if sb.result != nil {
		w.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "Sandbox %s has already finished", sb.id)
	}
	if err := cmd.Start(); err != nil {
		w.mu.Unlock()
		return nil, status.Errorf(codes.Internal, "starting the command: %v", err)
	}
	e.cmd = cmd
	sb.execs[id] = e
	w.mu.Unlock()
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(time.Duration(timeout)*time.Second, func() {
			e.timedOut = true
			e.kill()
		})
	}
	go func() {
		err := cmd.Wait()
		if timer != nil {
			timer.Stop()
		}
		e.out.close()
		e.err.close()
		var code, sig int32
		if ee, ok := err.(*exec.ExitError); ok {
			ws := ee.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				sig = int32(ws.Signal())
				e.signal = &sig
			} else {
				code = int32(ws.ExitStatus())
				e.code = &code
			}
		} else {
			e.code = &code
		}
		if e.timedOut { // as Modal: a command past its timeout reports -1
			code = -1
			e.code, e.signal = &code, nil
		}
		close(e.exited)
	}()
	return e, nil
}

// kill ends the exec's whole process group.
func (e *execution) kill() {
	if e.cmd != nil && e.cmd.Process != nil {
		syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// writeStdin feeds data at offset; bytes before what was written already are
// dropped (a retried write), a gap is refused.
func (e *execution) writeStdin(off uint64, data []byte, eof bool) error {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	if off > e.written {
		return status.Errorf(codes.InvalidArgument, "stdin offset %d is past the %d bytes written", off, e.written)
	}
	skip := e.written - off
	if skip < uint64(len(data)) && !e.eof {
		n, err := e.stdin.Write(data[skip:])
		e.written += uint64(n)
		if err != nil { // the command closed its stdin or ended: Modal drops the bytes
			e.written += uint64(len(data)) - skip - uint64(n)
		}
	}
	if eof && !e.eof {
		e.eof = true
		e.stdin.Close()
	}
	return nil
}

func (e *execution) wait(ctx context.Context) error {
	select {
	case <-e.exited:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}
