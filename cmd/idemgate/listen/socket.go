package listen

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
)

// SocketMode is the mode of a unix socket idemgate listens on: owner and
// group (the container sharing the socket's volume) may connect, nobody
// else (docs/design.md §12).
const SocketMode fs.FileMode = 0o660

// Open listens on addr: host:port over TCP, or unix:///path on a unix
// socket created with SocketMode and removed when the listener is closed.
func Open(addr string) (net.Listener, error) {
	path, ok := settings.UnixSocketPath(addr)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// The socket is created under the umask (0o755 under the usual 022:
	// nobody but the owner can connect) and only then opened to the group.
	if err := os.Chmod(path, SocketMode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("failed to set mode %o on %s: %w", SocketMode, path, err)
	}
	// A listener net created the file for unlinks it on Close (the
	// default, stated here because the removal on exit is part of §12).
	lis.SetUnlinkOnClose(true)
	return lis, nil
}

// removeStale removes a socket file left by a process that is gone, so a
// restart after a crash can bind again. It never removes anything but a
// socket, nor a socket a live process still answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: refusing to replace it", path)
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("%s is in use by another process", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s exists and cannot be checked: %w", path, err)
	}
	return os.Remove(path)
}
