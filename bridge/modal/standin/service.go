package main

// The RPCs the stand-in implements, with the error codes Modal answers.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	pb "github.com/modal-labs/modal-client/go/proto/modal_proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type control struct {
	pb.UnimplementedModalClientServer
	w *world
}

const builderVersion = "2025.06"

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func (c *control) AuthTokenGet(ctx context.Context, _ *pb.AuthTokenGetRequest) (*pb.AuthTokenGetResponse, error) {
	return pb.AuthTokenGetResponse_builder{Token: authToken}.Build(), nil
}

func (c *control) EnvironmentGetOrCreate(ctx context.Context, r *pb.EnvironmentGetOrCreateRequest) (*pb.EnvironmentGetOrCreateResponse, error) {
	name := r.GetDeploymentName()
	if name == "" {
		name = "main"
	}
	if name != "main" {
		return nil, status.Errorf(codes.NotFound, "Environment '%s' not found", name)
	}
	return pb.EnvironmentGetOrCreateResponse_builder{EnvironmentId: "en-standin",
		Metadata: pb.EnvironmentMetadata_builder{Name: name,
			Settings: pb.EnvironmentSettings_builder{ImageBuilderVersion: builderVersion}.Build()}.Build()}.Build(), nil
}

func (c *control) AppGetOrCreate(ctx context.Context, r *pb.AppGetOrCreateRequest) (*pb.AppGetOrCreateResponse, error) {
	if r.GetAppName() == "" {
		return nil, status.Error(codes.InvalidArgument, "app name is required")
	}
	key := r.GetEnvironmentName() + "/" + r.GetAppName()
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	id := c.w.apps[key]
	if id == "" {
		if r.GetObjectCreationType() == pb.ObjectCreationType_OBJECT_CREATION_TYPE_UNSPECIFIED {
			return nil, status.Errorf(codes.NotFound, "App '%s' not found", r.GetAppName())
		}
		id = newID("ap-")
		c.w.apps[key] = id
	}
	return pb.AppGetOrCreateResponse_builder{AppId: id}.Build(), nil
}

// A registry image is taken as it is: its commands run on the host's /usr.
func (c *control) ImageGetOrCreate(ctx context.Context, r *pb.ImageGetOrCreateRequest) (*pb.ImageGetOrCreateResponse, error) {
	if r.GetImage() == nil {
		return nil, status.Error(codes.InvalidArgument, "image definition is required")
	}
	id := r.GetExistingImageId()
	c.w.mu.Lock()
	if id == "" {
		id = newID("im-")
		c.w.images[id] = ""
	} else if _, ok := c.w.images[id]; !ok {
		c.w.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "Image %s not found", id)
	}
	c.w.mu.Unlock()
	return pb.ImageGetOrCreateResponse_builder{ImageId: id,
		Result: pb.GenericResult_builder{Status: pb.GenericResult_GENERIC_STATUS_SUCCESS}.Build()}.Build(), nil
}

func (c *control) ImageFromId(ctx context.Context, r *pb.ImageFromIdRequest) (*pb.ImageFromIdResponse, error) {
	c.w.mu.Lock()
	_, ok := c.w.images[r.GetImageId()]
	c.w.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "Image %s not found", r.GetImageId())
	}
	return pb.ImageFromIdResponse_builder{ImageId: r.GetImageId()}.Build(), nil
}

// V2 (the SDK's default from v0.11): the task and the router's access come
// with the answer; the environment comes as secret sources.
func (c *control) SandboxCreateV2(ctx context.Context, r *pb.SandboxCreateV2Request) (*pb.SandboxCreateV2Response, error) {
	sb, err := c.create(r.GetAppId(), r.GetDefinition(), r.GetTags(), r.GetSecretSources())
	if err != nil {
		return nil, err
	}
	return pb.SandboxCreateV2Response_builder{SandboxId: sb.id, TaskId: sb.taskID,
		CommandRouterAccess: pb.CommandRouterAccess_builder{Jwt: routerJWT, Url: c.routerURL(ctx)}.Build()}.Build(), nil
}

// The router is this same server. Both SDKs treat a router on localhost
// specially: Go takes only an https:// URL and then speaks plaintext, Python
// speaks TLS (unverified) to https:// and plaintext to http://; so the Go
// client gets https:// and every other client http://.
func (c *control) routerURL(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	scheme := "http"
	if first(md, "x-modal-client-type") == strconv.Itoa(int(pb.ClientType_CLIENT_TYPE_LIBMODAL_GO)) {
		scheme = "https"
	}
	return fmt.Sprintf("%s://127.0.0.1:%d", scheme, c.w.port)
}

func (c *control) create(appID string, d *pb.Sandbox, tags []*pb.SandboxTag, sources []*pb.SecretSource) (*sandbox, error) {
	if d == nil {
		return nil, status.Error(codes.InvalidArgument, "sandbox definition is required")
	}
	c.w.mu.Lock()
	appOK := false
	for _, id := range c.w.apps {
		appOK = appOK || id == appID
	}
	imageRoot, imageOK := c.w.images[d.GetImageId()]
	env := map[string]string{}
	ids := d.GetSecretIds()
	for _, s := range sources {
		if s.HasSecretId() {
			ids = append(ids, s.GetSecretId())
		}
	}
	for _, sid := range ids {
		s, ok := c.w.secrets[sid]
		if !ok {
			c.w.mu.Unlock()
			return nil, status.Errorf(codes.NotFound, "Secret %s not found", sid)
		}
		for k, v := range s {
			env[k] = v
		}
	}
	c.w.mu.Unlock()
	for _, s := range sources {
		for k, v := range s.GetEnv().GetContents() {
			env[k] = v
		}
	}
	if !appOK {
		return nil, status.Errorf(codes.NotFound, "App %s not found", appID)
	}
	if !imageOK {
		return nil, status.Errorf(codes.NotFound, "Image %s not found", d.GetImageId())
	}
	if d.GetResources().GetGpuConfig() != nil && d.GetResources().GetGpuConfig().GetCount() > 0 {
		return nil, status.Error(codes.ResourceExhausted, "the stand-in has no GPUs")
	}
	sb := &sandbox{id: newID("sb-"), appID: appID, taskID: newID("ta-"), imageID: d.GetImageId(),
		created: now(), tags: map[string]string{}, env: env, workdir: d.GetWorkdir(),
		blockNetwork: d.GetBlockNetwork() || d.GetNetworkAccess().GetNetworkAccessType() == pb.NetworkAccess_BLOCKED,
		timeoutSecs:  d.GetTimeoutSecs(), milliCPU: d.GetResources().GetMilliCpu(),
		memoryMB: d.GetResources().GetMemoryMb(), done: make(chan struct{}), execs: map[string]*execution{}}
	for _, t := range tags {
		sb.tags[t.GetTagName()] = t.GetTagValue()
	}
	if err := c.w.start(sb, imageRoot); err != nil {
		os.RemoveAll(sb.root)
		return nil, err
	}
	c.w.mu.Lock()
	c.w.sandboxes[sb.id] = sb
	c.w.tasks[sb.taskID] = sb
	c.w.mu.Unlock()
	return sb, nil
}

func (c *control) SandboxGetTaskId(ctx context.Context, r *pb.SandboxGetTaskIdRequest) (*pb.SandboxGetTaskIdResponse, error) {
	sb, err := c.w.sandbox(r.GetSandboxId())
	if err != nil {
		return nil, err
	}
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	if sb.result != nil {
		return pb.SandboxGetTaskIdResponse_builder{TaskResult: sb.result}.Build(), nil
	}
	return pb.SandboxGetTaskIdResponse_builder{TaskId: &sb.taskID}.Build(), nil
}

func (c *control) TaskGetCommandRouterAccess(ctx context.Context, r *pb.TaskGetCommandRouterAccessRequest) (*pb.TaskGetCommandRouterAccessResponse, error) {
	if _, err := c.w.task(r.GetTaskId()); err != nil {
		return nil, err
	}
	return pb.TaskGetCommandRouterAccessResponse_builder{Jwt: routerJWT,
		Url: c.routerURL(ctx)}.Build(), nil
}

func (c *control) SandboxWait(ctx context.Context, r *pb.SandboxWaitRequest) (*pb.SandboxWaitResponse, error) {
	sb, err := c.w.sandbox(r.GetSandboxId())
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(time.Duration(float64(r.GetTimeout()) * float64(time.Second)))
	defer t.Stop()
	select {
	case <-sb.done:
	case <-t.C:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return pb.SandboxWaitResponse_builder{Result: sb.result}.Build(), nil
}

func (c *control) SandboxTerminate(ctx context.Context, r *pb.SandboxTerminateRequest) (*pb.SandboxTerminateResponse, error) {
	sb, err := c.w.sandbox(r.GetSandboxId())
	if err != nil {
		return nil, err
	}
	c.w.finish(sb, pb.GenericResult_builder{Status: pb.GenericResult_GENERIC_STATUS_TERMINATED}.Build())
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return pb.SandboxTerminateResponse_builder{ExistingResult: sb.result}.Build(), nil
}

func (c *control) SandboxListV2(ctx context.Context, r *pb.SandboxListRequest) (*pb.SandboxListResponse, error) {
	tags := map[string]string{}
	for _, t := range r.GetTags() {
		tags[t.GetTagName()] = t.GetTagValue()
	}
	var out []*pb.SandboxInfo
	for _, sb := range c.w.listed(r.GetAppId(), r.GetBeforeTimestamp(), tags, r.GetIncludeFinished()) {
		var ts []*pb.SandboxTag
		for k, v := range sb.tags {
			ts = append(ts, pb.SandboxTag_builder{TagName: k, TagValue: v}.Build())
		}
		out = append(out, pb.SandboxInfo_builder{Id: sb.id, CreatedAt: sb.created, AppId: sb.appID, Tags: ts,
			ImageId: sb.imageID, TimeoutSecs: sb.timeoutSecs}.Build())
		if len(out) == 100 { // a page, as Modal's
			break
		}
	}
	return pb.SandboxListResponse_builder{Sandboxes: out}.Build(), nil
}

func (c *control) SandboxTagsGet(ctx context.Context, r *pb.SandboxTagsGetRequest) (*pb.SandboxTagsGetResponse, error) {
	sb, err := c.w.sandbox(r.GetSandboxId())
	if err != nil {
		return nil, err
	}
	var ts []*pb.SandboxTag
	for k, v := range sb.tags {
		ts = append(ts, pb.SandboxTag_builder{TagName: k, TagValue: v}.Build())
	}
	return pb.SandboxTagsGetResponse_builder{Tags: ts}.Build(), nil
}

// The V2 forms the Python client uses take and answer the same messages.
func (c *control) SandboxWaitV2(ctx context.Context, r *pb.SandboxWaitRequest) (*pb.SandboxWaitResponse, error) {
	return c.SandboxWait(ctx, r)
}

func (c *control) SandboxTerminateV2(ctx context.Context, r *pb.SandboxTerminateRequest) (*pb.SandboxTerminateResponse, error) {
	return c.SandboxTerminate(ctx, r)
}

// --------------------------------------------------------- command router

type router struct {
	pb.UnimplementedTaskCommandRouterServer
	w *world
}

func (t *router) exec(taskID, execID string) (*sandbox, *execution, error) {
	sb, err := t.w.task(taskID)
	if err != nil {
		return nil, nil, err
	}
	t.w.mu.Lock()
	defer t.w.mu.Unlock()
	e := sb.execs[execID]
	if e == nil {
		return nil, nil, status.Errorf(codes.NotFound, "exec %s not found", execID)
	}
	return sb, e, nil
}

func (t *router) TaskExecStart(ctx context.Context, r *pb.TaskExecStartRequest) (*pb.TaskExecStartResponse, error) {
	sb, err := t.w.task(r.GetTaskId())
	if err != nil {
		return nil, err
	}
	if r.GetExecId() == "" {
		return nil, status.Error(codes.InvalidArgument, "exec_id is required")
	}
	t.w.mu.Lock()
	_, dup := sb.execs[r.GetExecId()]
	env := map[string]string{}
	for _, sid := range r.GetSecretIds() {
		for k, v := range t.w.secrets[sid] {
			env[k] = v
		}
	}
	t.w.mu.Unlock()
	if dup {
		return nil, status.Errorf(codes.AlreadyExists, "exec %s already exists", r.GetExecId())
	}
	for k, v := range r.GetEnv() {
		env[k] = v
	}
	var timeout uint32
	if r.HasTimeoutSecs() {
		timeout = r.GetTimeoutSecs()
	}
	_, err = t.w.startExec(sb, r.GetExecId(), r.GetCommandArgs(), r.GetWorkdir(), env, timeout,
		r.GetStdoutConfig() == pb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_PIPE,
		r.GetStderrConfig() == pb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_PIPE)
	if err != nil {
		return nil, err
	}
	return pb.TaskExecStartResponse_builder{}.Build(), nil
}

func (t *router) TaskExecStdinWrite(ctx context.Context, r *pb.TaskExecStdinWriteRequest) (*pb.TaskExecStdinWriteResponse, error) {
	_, e, err := t.exec(r.GetTaskId(), r.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := e.writeStdin(r.GetOffset(), r.GetData(), r.GetEof()); err != nil {
		return nil, err
	}
	return pb.TaskExecStdinWriteResponse_builder{}.Build(), nil
}

func (t *router) TaskExecStdioRead(r *pb.TaskExecStdioReadRequest, s grpc.ServerStreamingServer[pb.TaskExecStdioReadResponse]) error {
	_, e, err := t.exec(r.GetTaskId(), r.GetExecId())
	if err != nil {
		return err
	}
	o := e.out
	if r.GetFileDescriptor() == pb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR {
		o = e.err
	}
	off := r.GetOffset()
	for {
		data, ended, wake := o.from(off, 1<<20)
		if len(data) > 0 {
			if err := s.Send(pb.TaskExecStdioReadResponse_builder{Data: data}.Build()); err != nil {
				return err
			}
			off += uint64(len(data))
			continue
		}
		if ended {
			return nil
		}
		select {
		case <-wake:
		case <-s.Context().Done():
			return status.FromContextError(s.Context().Err()).Err()
		}
	}
}

func (t *router) TaskExecWait(ctx context.Context, r *pb.TaskExecWaitRequest) (*pb.TaskExecWaitResponse, error) {
	_, e, err := t.exec(r.GetTaskId(), r.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := e.wait(ctx); err != nil {
		return nil, err
	}
	if e.signal != nil {
		return pb.TaskExecWaitResponse_builder{Signal: e.signal}.Build(), nil
	}
	return pb.TaskExecWaitResponse_builder{Code: e.code}.Build(), nil
}

// A snapshot is a copy of the sandbox's root, an image a create can name.
func (t *router) TaskSnapshotFilesystem(ctx context.Context, r *pb.TaskSnapshotFilesystemRequest) (*pb.TaskSnapshotFilesystemResponse, error) {
	sb, err := t.w.task(r.GetTaskId())
	if err != nil {
		return nil, err
	}
	t.w.mu.Lock()
	ended := sb.result != nil
	t.w.mu.Unlock()
	if ended {
		return nil, status.Errorf(codes.FailedPrecondition, "Sandbox %s has already finished", sb.id)
	}
	id := newID("im-")
	dir := filepath.Join(t.w.dir, "images", id)
	if err := os.MkdirAll(dir, 0755); err != nil {
		return nil, status.Errorf(codes.Internal, "snapshot: %v", err)
	}
	if err := copyTree(sb.root, dir); err != nil {
		os.RemoveAll(dir)
		return nil, status.Errorf(codes.Internal, "snapshot: %v", err)
	}
	t.w.mu.Lock()
	t.w.images[id] = dir
	t.w.mu.Unlock()
	return pb.TaskSnapshotFilesystemResponse_builder{ImageId: id}.Build(), nil
}
