// sbx-modal-bridge: the modal provider's (providers/modal.lua) way to Modal.
// Modal speaks only gRPC; this program speaks it through the official Go SDK
// and offers sbxlua a unix socket with one JSON request per connection:
//
//	{"op":"create"|"terminate"|"list"|"alive"|"snapshot"|"agent"|"ping", ...}\n
//
// answered by one JSON line {"ok":true,...} or {"ok":false,"error":...,
// "code":<gRPC code name>}. After the answer to "agent" the connection is the
// byte stream of `sbx-agent serve` running in the sandbox (one Exec whose
// stdin and stdout are spliced to the connection), so commands and files use
// the agent protocol. The bridge exits when its stdin ends (its sbxlua went).
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	modal "github.com/modal-labs/modal-client/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type request struct {
	Op           string            `json:"op"`
	TokenID      string            `json:"token_id"`
	TokenSecret  string            `json:"token_secret"`
	Environment  string            `json:"environment"`
	App          string            `json:"app"`
	Image        string            `json:"image"`
	CPU          float64           `json:"cpu"`
	MemoryMiB    int               `json:"memory_mib"`
	TimeoutSecs  int               `json:"timeout_secs"`
	Env          map[string]string `json:"env"`
	BlockNetwork bool              `json:"block_network"`
	Tags         map[string]string `json:"tags"`
	Workdir      string            `json:"workdir"`
	SandboxID    string            `json:"sandbox_id"`
}

type answer map[string]any

var (
	agentPath string // this build's sbx-agent on the host
	agentData []byte
	agentName string // its path inside a sandbox, named by its hash
	clientsMu sync.Mutex
	clients   = map[string]*modal.Client{}
)

// One SDK client per credential set (the provider sends its credentials
// with every request; the bridge keeps none of its own).
func client(r *request) (*modal.Client, error) {
	if r.TokenID == "" || r.TokenSecret == "" {
		return nil, status.Error(codes.Unauthenticated, "no Modal credentials (token id and secret)")
	}
	key := r.TokenID + "\x00" + r.TokenSecret + "\x00" + r.Environment
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if c := clients[key]; c != nil {
		return c, nil
	}
	c, err := modal.NewClientWithOptions(&modal.ClientParams{TokenID: r.TokenID, TokenSecret: r.TokenSecret,
		Environment: r.Environment})
	if err != nil {
		return nil, err
	}
	clients[key] = c
	return c, nil
}

// The gRPC code of an SDK error, by name ("NotFound", ...).
func codeOf(err error) string {
	var nf modal.NotFoundError
	var inv modal.InvalidError
	var ae modal.AlreadyExistsError
	var re modal.ResourceExhaustedError
	var ce modal.ConflictError
	var te modal.ExecTimeoutError
	switch {
	case errors.As(err, &nf):
		return "NotFound"
	case errors.As(err, &inv):
		return "InvalidArgument"
	case errors.As(err, &ae):
		return "AlreadyExists"
	case errors.As(err, &re):
		return "ResourceExhausted"
	case errors.As(err, &ce):
		return "FailedPrecondition"
	case errors.As(err, &te):
		return "DeadlineExceeded"
	case errors.Is(err, context.DeadlineExceeded):
		return "DeadlineExceeded"
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	// the SDK wraps gRPC errors in its own types: look for the status inside
	for e := err; e != nil; e = errors.Unwrap(e) {
		if s, ok := status.FromError(e); ok && s.Code() != codes.Unknown {
			return s.Code().String()
		}
	}
	if strings.Contains(err.Error(), "credentials") {
		return "Unauthenticated"
	}
	return "Unknown"
}

func fail(err error) answer {
	return answer{"ok": false, "error": err.Error(), "code": codeOf(err)}
}

func sandbox(ctx context.Context, c *modal.Client, id string) (*modal.Sandbox, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "no sandbox_id")
	}
	return c.Sandboxes.FromID(ctx, id, nil)
}

func create(ctx context.Context, c *modal.Client, r *request) answer {
	if r.App == "" || r.Image == "" {
		return fail(status.Error(codes.InvalidArgument, "create needs app and image"))
	}
	app, err := c.Apps.FromName(ctx, r.App, &modal.AppFromNameParams{CreateIfMissing: true,
		Environment: r.Environment})
	if err != nil {
		return fail(err)
	}
	var image *modal.Image
	if strings.HasPrefix(r.Image, "im-") { // a filesystem snapshot
		image, err = c.Images.FromID(ctx, r.Image, nil)
		if err != nil {
			return fail(err)
		}
	} else {
		image = c.Images.FromRegistry(r.Image, nil)
	}
	p := &modal.SandboxCreateParams{CPU: r.CPU, MemoryMiB: r.MemoryMiB,
		Timeout: time.Duration(r.TimeoutSecs) * time.Second, BlockNetwork: r.BlockNetwork,
		Tags: r.Tags, Workdir: r.Workdir, Command: []string{"sleep", "infinity"}}
	if len(r.Env) > 0 {
		p.Env = r.Env
	}
	sb, err := c.Sandboxes.Create(ctx, app, image, p)
	if err != nil {
		return fail(err)
	}
	return answer{"ok": true, "sandbox_id": sb.SandboxID}
}

func list(ctx context.Context, c *modal.Client, r *request) answer {
	p := &modal.SandboxListParams{Tags: r.Tags, Environment: r.Environment}
	if r.App != "" {
		app, err := c.Apps.FromName(ctx, r.App, &modal.AppFromNameParams{Environment: r.Environment})
		if err != nil {
			if codeOf(err) == "NotFound" { // no app: nothing of ours
				return answer{"ok": true, "sandboxes": []any{}}
			}
			return fail(err)
		}
		p.AppID = app.AppID
	}
	seq, err := c.Sandboxes.List(ctx, p)
	if err != nil {
		return fail(err)
	}
	out := []any{}
	for sb, err := range seq {
		if err != nil {
			return fail(err)
		}
		tags, err := sb.GetTags(ctx, nil)
		if err != nil {
			if codeOf(err) == "NotFound" {
				continue // gone meanwhile
			}
			return fail(err)
		}
		out = append(out, answer{"sandbox_id": sb.SandboxID, "tags": tags})
	}
	return answer{"ok": true, "sandboxes": out}
}

func handle(ctx context.Context, r *request) answer {
	if r.Op == "ping" {
		return answer{"ok": true, "agent": agentName}
	}
	c, err := client(r)
	if err != nil {
		return fail(err)
	}
	switch r.Op {
	case "create":
		return create(ctx, c, r)
	case "list":
		return list(ctx, c, r)
	case "terminate":
		sb, err := sandbox(ctx, c, r.SandboxID)
		if err != nil {
			return fail(err)
		}
		if _, err := sb.Terminate(ctx, nil); err != nil && codeOf(err) != "NotFound" {
			return fail(err)
		}
		return answer{"ok": true}
	case "alive":
		sb, err := sandbox(ctx, c, r.SandboxID)
		if err != nil {
			return fail(err)
		}
		code, err := sb.Poll(ctx, nil)
		if err != nil {
			if codeOf(err) == "NotFound" {
				return answer{"ok": true, "alive": false}
			}
			return fail(err)
		}
		return answer{"ok": true, "alive": code == nil}
	case "snapshot":
		sb, err := sandbox(ctx, c, r.SandboxID)
		if err != nil {
			return fail(err)
		}
		img, err := sb.SnapshotFilesystem(ctx, nil)
		if err != nil {
			return fail(err)
		}
		return answer{"ok": true, "image_id": img.ImageID}
	}
	return fail(status.Error(codes.InvalidArgument, fmt.Sprintf("unknown op %q", r.Op)))
}

// ------------------------------------------------------------------ agent

// Exec a short command; its exit code and stderr.
func run(ctx context.Context, sb *modal.Sandbox, argv []string, stdin []byte) (int, string, error) {
	p, err := sb.Exec(ctx, argv, &modal.SandboxExecParams{Stdout: modal.Ignore, Timeout: 120 * time.Second})
	if err != nil {
		return 0, "", err
	}
	werr := make(chan error, 1)
	go func() {
		if len(stdin) > 0 {
			for off := 0; off < len(stdin); off += 1 << 20 {
				end := min(off+1<<20, len(stdin))
				if _, err := p.Stdin.Write(stdin[off:end]); err != nil {
					werr <- err
					return
				}
			}
		}
		werr <- p.Stdin.Close()
	}()
	errb, _ := io.ReadAll(io.LimitReader(p.Stderr, 64<<10))
	code, err := p.Wait(ctx, nil)
	if err != nil {
		return 0, string(errb), err
	}
	if e := <-werr; e != nil && code == 0 {
		return 0, string(errb), e
	}
	return code, string(errb), nil
}

// The agent: installed once per sandbox under its hash (an Exec reading it
// from stdin: the SDK's filesystem calls drive a Modal-internal helper
// binary in the sandbox, and stdin needs only the Exec calls used anyway),
// then `sbx-agent serve` with its stdin and stdout spliced to conn.
func agent(ctx context.Context, conn net.Conn, rd *bufio.Reader, r *request) {
	reply := func(a answer) {
		b, _ := json.Marshal(a)
		conn.Write(append(b, '\n'))
	}
	c, err := client(r)
	if err != nil {
		reply(fail(err))
		return
	}
	sb, err := sandbox(ctx, c, r.SandboxID)
	if err != nil {
		reply(fail(err))
		return
	}
	code, _, err := run(ctx, sb, []string{"test", "-x", agentName}, nil)
	if err != nil {
		reply(fail(err))
		return
	}
	if code != 0 {
		script := `set -e; d=$(dirname "$1"); mkdir -p "$d"; cat > "$1.part.$$"; chmod 755 "$1.part.$$"; mv -f "$1.part.$$" "$1"`
		code, serr, err := run(ctx, sb, []string{"sh", "-c", script, "sh", agentName}, agentData)
		if err != nil {
			reply(fail(err))
			return
		}
		if code == -1 || code == 137 { // how Modal reports an exec past its timeout
			reply(answer{"ok": false, "code": "DeadlineExceeded",
				"error": "installing sbx-agent in the sandbox timed out (exit " + fmt.Sprint(code) + ")"})
			return
		}
		if code != 0 {
			reply(answer{"ok": false, "code": "FailedPrecondition",
				"error": fmt.Sprintf("installing sbx-agent in the sandbox failed (exit %d): %s", code, strings.TrimSpace(serr))})
			return
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p, err := sb.Exec(sctx, []string{agentName, "serve"}, nil)
	if err != nil {
		reply(fail(err))
		return
	}
	reply(answer{"ok": true})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // sbxlua -> agent: what the reader holds first, then the socket
		defer wg.Done()
		buf := make([]byte, 256<<10)
		for {
			n, err := rd.Read(buf)
			if n > 0 {
				if _, werr := p.Stdin.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		p.Stdin.Close()
	}()
	go func() { // the agent's stderr: kept by nobody, read so it never blocks
		io.Copy(io.Discard, p.Stderr)
	}()
	go func() { // agent -> sbxlua
		defer wg.Done()
		io.CopyBuffer(conn, p.Stdout, make([]byte, 256<<10))
		if uc, ok := conn.(*net.UnixConn); ok {
			uc.CloseWrite()
		}
	}()
	wg.Wait()
}

// ------------------------------------------------------------------ main

func serve(conn net.Conn) {
	defer conn.Close()
	rd := bufio.NewReaderSize(conn, 64<<10)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return
	}
	var r request
	if err := json.Unmarshal(line, &r); err != nil {
		b, _ := json.Marshal(fail(status.Error(codes.InvalidArgument, "bad request: "+err.Error())))
		conn.Write(append(b, '\n'))
		return
	}
	ctx := context.Background()
	if r.Op == "agent" {
		agent(ctx, conn, rd, &r)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	b, _ := json.Marshal(handle(ctx, &r))
	conn.Write(append(b, '\n'))
}

func main() {
	socket := flag.String("socket", "", "the unix socket to listen on")
	flag.StringVar(&agentPath, "agent", "", "this build's sbx-agent (a static Linux binary)")
	logFile := flag.String("log", "", "where the SDK's messages and this program's errors go (default stderr)")
	flag.Parse()
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0600)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sbx-modal-bridge:", err)
			os.Exit(1)
		}
		syscall.Dup2(int(f.Fd()), 2) // a panic's trace too
	}
	if *socket == "" || agentPath == "" {
		fmt.Fprintln(os.Stderr, "usage: sbx-modal-bridge --socket PATH --agent FILE")
		os.Exit(2)
	}
	var err error
	agentData, err = os.ReadFile(agentPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbx-modal-bridge:", err)
		os.Exit(1)
	}
	sum := sha256.Sum256(agentData)
	agentName = "/.sbx/bin/sbx-agent-" + hex.EncodeToString(sum[:8])
	os.Remove(*socket)
	ln, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbx-modal-bridge:", err)
		os.Exit(1)
	}
	os.Chmod(*socket, 0600)
	fmt.Println("ready")
	// the end of stdin is the end of the sbxlua that started it
	go func() {
		io.Copy(io.Discard, os.Stdin)
		ln.Close()
		os.Remove(*socket)
		os.Exit(0)
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			os.Remove(*socket)
			return
		}
		go serve(conn)
	}
}
