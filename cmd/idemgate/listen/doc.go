// Package listen opens idemgate's listeners as docs/design.md §12 asks:
// TCP or a unix socket (mode 0660, a stale file replaced only when it is a
// socket nobody answers on, removed on close), and TLS whose certificate,
// key and client CA are re-read when their files change. On the ext_proc
// listener it requires a client certificate signed by client_ca_file whose
// URI or DNS SAN is in client_sans, and refuses any other peer in the
// handshake: before gRPC sees the connection, so a refused peer opens no
// stream. Each refusal is a security event and a counter.
package listen
