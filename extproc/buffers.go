package extproc

import "sync"

// Bodies idemgate writes — a preview body with the fingerprint injected, an
// envelope (which embeds a replayed result) — are built in pooled buffers:
// gRPC serialises a reply during Send, so the buffer is free again as soon
// as Send returns, and a busy gateway stops allocating (and collecting) a
// body-sized buffer per request.

// maxPooledBody keeps rare large bodies (up to limits.max_body_bytes) from
// pinning memory in the pool.
const maxPooledBody = 64 << 10

type bufferPool struct{ p sync.Pool }

func (bp *bufferPool) get() *[]byte {
	if b, ok := bp.p.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 1024)
	return &b
}

func (bp *bufferPool) put(b *[]byte) {
	if cap(*b) > maxPooledBody {
		return
	}
	*b = (*b)[:0]
	bp.p.Put(b)
}

// buffer lends the exchange a pooled buffer for the reply being built; it
// goes back to the pool once that reply was sent (releaseBuffers).
func (ex *exchange) buffer() *[]byte {
	b := ex.srv.buffers.get()
	if ex.lent == nil {
		ex.lent = b
	} else {
		ex.lentMore = append(ex.lentMore, b)
	}
	return b
}

// keep records what a lent buffer grew into, so the larger array is the one
// pooled.
func keep(b *[]byte, grown []byte) []byte {
	*b = grown
	return grown
}

// releaseBuffers returns the buffers of the reply just sent (or dropped).
func (ex *exchange) releaseBuffers() {
	if ex.lent != nil {
		ex.srv.buffers.put(ex.lent)
		ex.lent = nil
	}
	for i, b := range ex.lentMore {
		ex.srv.buffers.put(b)
		ex.lentMore[i] = nil
	}
	ex.lentMore = ex.lentMore[:0]
}
