package main

// The stand-in's state: apps, images, secrets, sandboxes and their execs.
// A sandbox is a directory (its writable root) whose commands run under
// bwrap with the host's /usr, /etc and library directories read-only, their
// own pid namespace, and no network when the sandbox blocks it.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	pb "github.com/modal-labs/modal-client/go/proto/modal_proto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type world struct {
	mu        sync.Mutex
	dir       string
	port      int
	bwrap     string
	apps      map[string]string // "env/name" -> app id
	images    map[string]string // image id -> its root directory ("" for a registry image)
	secrets   map[string]map[string]string
	sandboxes map[string]*sandbox
	tasks     map[string]*sandbox // task id -> sandbox
}

type sandbox struct {
	id, appID, taskID, imageID string
	created                    float64
	tags                       map[string]string
	root                       string
	env                        map[string]string
	workdir                    string
	blockNetwork               bool
	timeoutSecs                uint32
	milliCPU, memoryMB         uint32
	result                     *pb.GenericResult // set once it ended
	done                       chan struct{}
	execs                      map[string]*execution
	timer                      *time.Timer
}

func newID(prefix string) string {
	b := make([]byte, 11)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func newWorld(dir string, port int) (*world, error) {
	for _, d := range []string{"sandboxes", "images"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0700); err != nil {
			return nil, err
		}
	}
	w := &world{dir: dir, port: port, apps: map[string]string{}, images: map[string]string{},
		secrets: map[string]map[string]string{}, sandboxes: map[string]*sandbox{}, tasks: map[string]*sandbox{}}
	w.bwrap, _ = exec.LookPath("bwrap")
	return w, nil
}

func (w *world) sandbox(id string) (*sandbox, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sb := w.sandboxes[id]
	if sb == nil {
		return nil, status.Errorf(codes.NotFound, "Sandbox %s not found", id)
	}
	return sb, nil
}

func (w *world) task(id string) (*sandbox, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sb := w.tasks[id]
	if sb == nil {
		return nil, status.Errorf(codes.NotFound, "task %s not found", id)
	}
	return sb, nil
}

// copyTree copies a sandbox root (cp -a: modes, links, ownership).
func copyTree(from, to string) error {
	if out, err := exec.Command("cp", "-a", from+"/.", to).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v: %s", err, out)
	}
	return nil
}

// start makes the sandbox's root (from an image snapshot, or empty with the
// usual directories) and arms its timeout.
func (w *world) start(sb *sandbox, imageRoot string) error {
	if w.bwrap == "" {
		return status.Error(codes.FailedPrecondition, "the stand-in runs sandboxes under bwrap, which is not installed")
	}
	sb.root = filepath.Join(w.dir, "sandboxes", sb.id)
	if err := os.MkdirAll(sb.root, 0755); err != nil {
		return err
	}
	if imageRoot != "" {
		if err := copyTree(imageRoot, sb.root); err != nil {
			return err
		}
	}
	// the host's merged-usr links (/bin -> usr/bin), made here: bwrap's --symlink would
	// make them in the root directory anyway, and fail the second time
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		if t, err := os.Readlink("/" + d); err == nil {
			os.Symlink(t, filepath.Join(sb.root, d))
		}
	}
	for _, d := range []string{"tmp", "var/tmp", "root", "home"} {
		os.MkdirAll(filepath.Join(sb.root, d), 0755)
	}
	os.Chmod(filepath.Join(sb.root, "tmp"), 01777)
	if sb.workdir != "" {
		os.MkdirAll(filepath.Join(sb.root, sb.workdir), 0755)
	}
	timeout := time.Duration(sb.timeoutSecs) * time.Second
	if timeout == 0 {
		timeout = 300 * time.Second
	}
	sb.timer = time.AfterFunc(timeout, func() {
		w.finish(sb, pb.GenericResult_builder{Status: pb.GenericResult_GENERIC_STATUS_TIMEOUT,
			Exception: "Sandbox timed out"}.Build())
	})
	return nil
}

// finish ends a sandbox: its processes are killed and its root removed.
// The first ending wins; returns whether this call ended it.
func (w *world) finish(sb *sandbox, result *pb.GenericResult) bool {
	w.mu.Lock()
	if sb.result != nil {
		w.mu.Unlock()
		return false
	}
	sb.result = result
	execs := make([]*execution, 0, len(sb.execs))
	for _, e := range sb.execs {
		execs = append(execs, e)
	}
	close(sb.done)
	if sb.timer != nil {
		sb.timer.Stop()
	}
	w.mu.Unlock()
	for _, e := range execs {
		e.kill()
	}
	for _, e := range execs {
		<-e.exited
	}
	os.RemoveAll(sb.root)
	return true
}

func (w *world) shutdown() {
	w.mu.Lock()
	all := make([]*sandbox, 0, len(w.sandboxes))
	for _, sb := range w.sandboxes {
		all = append(all, sb)
	}
	w.mu.Unlock()
	for _, sb := range all {
		w.finish(sb, pb.GenericResult_builder{Status: pb.GenericResult_GENERIC_STATUS_TERMINATED}.Build())
	}
	os.RemoveAll(filepath.Join(w.dir, "images"))
}

// The bwrap command line of one command in sb.
func (w *world) argv(sb *sandbox, args []string, workdir string) []string {
	a := []string{w.bwrap, "--bind", sb.root, "/", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		if _, err := os.Readlink(d); err == nil {
			continue // made in the root by start
		} else if st, err := os.Stat(d); err == nil && st.IsDir() {
			a = append(a, "--ro-bind", d, d)
		}
	}
	a = append(a, "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
		"--hostname", "modal", "--die-with-parent", "--new-session")
	if sb.blockNetwork {
		a = append(a, "--unshare-net")
	}
	if workdir == "" {
		workdir = sb.workdir
	}
	if workdir == "" {
		workdir = "/"
	}
	a = append(a, "--chdir", workdir, "--")
	return append(a, args...)
}

// sorted newest first, for SandboxList's paging by created_at
func (w *world) listed(appID string, before float64, tags map[string]string, finished bool) []*sandbox {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*sandbox
	for _, sb := range w.sandboxes {
		if appID != "" && sb.appID != appID {
			continue
		}
		if before > 0 && sb.created >= before {
			continue
		}
		if !finished && sb.result != nil {
			continue
		}
		ok := true
		for k, v := range tags {
			if sb.tags[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].created > out[j].created })
	return out
}
