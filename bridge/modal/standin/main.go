// modal-standin: a stand-in for Modal's API server, for tests without a
// Modal account. It serves the control plane (modal.client.ModalClient) and
// the task command router (modal.task_command_router.TaskCommandRouter) of
// the SDK's own generated stubs, plaintext on 127.0.0.1, and implements only
// the RPCs sbx-modal-bridge and the test's Python client use (every other
// one answers Unimplemented). Each sandbox is a directory run under bwrap.
//
//	MODAL_TOKEN_ID=... MODAL_TOKEN_SECRET=... modal-standin --state DIR [--port N] [--log FILE]
//
// prints "listening 127.0.0.1:PORT" once it serves (later complaints go to
// DIR/stderr.log), and exits when its stdin ends. Every call is checked
// against those credentials (Unauthenticated otherwise); --log gets one JSON
// line per call (method, request, error code).
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	pb "github.com/modal-labs/modal-client/go/proto/modal_proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var (
	tokenID, tokenSecret string
	authToken            string // what AuthTokenGet hands out
	routerJWT            string // what the command router accepts
	logMu                sync.Mutex
	logOut               io.Writer
)

// A JWT-shaped token (the SDK reads its exp; nobody checks a signature).
func jwt(sub string) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	body, _ := json.Marshal(map[string]any{"sub": sub, "exp": time.Now().Add(24 * time.Hour).Unix()})
	return head + "." + enc.EncodeToString(body) + "." + enc.EncodeToString([]byte("standin"))
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

// The credentials of a call: the token pair on every control-plane call (and
// the auth token but on AuthTokenGet), the router's JWT on router calls.
func authorize(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if strings.HasPrefix(method, "/modal.task_command_router.") {
		if first(md, "authorization") != "Bearer "+routerJWT {
			return status.Error(codes.Unauthenticated, "the command router needs the JWT of TaskGetCommandRouterAccess")
		}
		return nil
	}
	id, secret := first(md, "x-modal-token-id"), first(md, "x-modal-token-secret")
	if id == "" || secret == "" {
		return status.Error(codes.Unauthenticated, "missing credentials (x-modal-token-id, x-modal-token-secret)")
	}
	if id != tokenID || secret != tokenSecret {
		return status.Error(codes.Unauthenticated, "Token ID/Secret are invalid")
	}
	if method != "/modal.client.ModalClient/AuthTokenGet" && method != "/modal.client.ModalClient/ClientHello" {
		if t := first(md, "x-modal-auth-token"); t != "" && t != authToken {
			return status.Error(codes.Unauthenticated, "invalid auth token")
		}
	}
	return nil
}

func record(method string, req any, err error) {
	if logOut == nil {
		return
	}
	line := map[string]any{"method": method}
	if m, ok := req.(proto.Message); ok {
		if b, e := protojson.Marshal(m); e == nil {
			line["request"] = json.RawMessage(b)
		}
	}
	if err != nil {
		line["code"] = status.Code(err).String()
	}
	b, _ := json.Marshal(line)
	logMu.Lock()
	logOut.Write(append(b, '\n'))
	logMu.Unlock()
}

func unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := authorize(ctx, info.FullMethod); err != nil {
		record(info.FullMethod, req, err)
		return nil, err
	}
	resp, err := h(ctx, req)
	record(info.FullMethod, req, err)
	return resp, err
}

type loggedStream struct {
	grpc.ServerStream
	method string
	logged bool
}

func (s *loggedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.logged {
		s.logged = true
		record(s.method, m, nil)
	}
	return err
}

func streaming(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := authorize(ss.Context(), info.FullMethod); err != nil {
		record(info.FullMethod, nil, err)
		return err
	}
	return h(srv, &loggedStream{ServerStream: ss, method: info.FullMethod})
}

func main() {
	state := flag.String("state", "", "a directory for sandboxes and images (made if missing)")
	port := flag.Int("port", 0, "the port on 127.0.0.1 (0: a free one)")
	logFile := flag.String("log", "", "one JSON line per call")
	flag.Parse()
	tokenID, tokenSecret = os.Getenv("MODAL_TOKEN_ID"), os.Getenv("MODAL_TOKEN_SECRET")
	if *state == "" || tokenID == "" || tokenSecret == "" {
		fmt.Fprintln(os.Stderr, "usage: MODAL_TOKEN_ID=.. MODAL_TOKEN_SECRET=.. modal-standin --state DIR [--port N] [--log FILE]")
		os.Exit(2)
	}
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0600)
		if err != nil {
			fmt.Fprintln(os.Stderr, "modal-standin:", err)
			os.Exit(1)
		}
		logOut = f
	}
	authToken, routerJWT = jwt("client"), jwt("router")
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "modal-standin:", err)
		os.Exit(1)
	}
	w, err := newWorld(*state, ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "modal-standin:", err)
		os.Exit(1)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(streaming),
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20))
	pb.RegisterModalClientServer(s, &control{w: w})
	pb.RegisterTaskCommandRouterServer(s, &router{w: w})
	fmt.Printf("listening %s\n", ln.Addr())
	os.Stdout.Sync()
	// from here on what goes to stderr (gRPC's own complaints) goes to a file:
	// whoever started it reads stdout for the line above and nothing after
	if f, err := os.OpenFile(filepath.Join(*state, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0600); err == nil {
		syscall.Dup2(int(f.Fd()), 2)
	}
	go func() {
		io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		w.shutdown()
		os.Exit(0)
	}()
	if err := s.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "modal-standin:", err)
		os.Exit(1)
	}
}
