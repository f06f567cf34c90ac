package listen

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenUnixSocket: a unix socket listener has mode 0660, accepts, and
// its file is gone once it is closed.
func TestOpenUnixSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "extproc.sock")
	lis, err := Open("unix://" + path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, fs.ModeSocket, fi.Mode().Type())
	require.Equal(t, SocketMode, fi.Mode().Perm())

	accepted := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	c.Close()
	require.NoError(t, <-accepted)

	require.NoError(t, lis.Close())
	_, err = os.Stat(path)
	require.ErrorIs(t, err, fs.ErrNotExist, "removed on close")
}

// TestOpenUnixSocketLeftovers: a socket file left by a process that is
// gone is replaced; a socket someone still answers on, and a file that is
// not a socket, are refused and left alone.
func TestOpenUnixSocketLeftovers(t *testing.T) {
	dir := t.TempDir()

	stale := filepath.Join(dir, "stale.sock")
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	require.NoError(t, err)
	old.SetUnlinkOnClose(false) // as after a crash: the file stays
	require.NoError(t, old.Close())
	_, err = os.Stat(stale)
	require.NoError(t, err)
	lis, err := Open("unix://" + stale)
	require.NoError(t, err, "a stale socket is replaced")
	require.NoError(t, lis.Close())

	live := filepath.Join(dir, "live.sock")
	other, err := net.Listen("unix", live)
	require.NoError(t, err)
	defer other.Close()
	_, err = Open("unix://" + live)
	require.ErrorContains(t, err, "is in use by another process")

	regular := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(regular, []byte("keep me"), 0o600))
	_, err = Open("unix://" + regular)
	require.ErrorContains(t, err, "is not a socket: refusing to replace it")
	b, err := os.ReadFile(regular)
	require.NoError(t, err)
	require.Equal(t, "keep me", string(b))
}
