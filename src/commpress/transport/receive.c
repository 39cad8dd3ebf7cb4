/* The reliable multicast's hot path on receipt: DATA datagrams of the running operation,
 * checked and copied into their root's buffer, a batch at a time (the datagrams of one
 * coalesced read). Everything else (another kind, operation or channel, a duplicate, a
 * datagram that fails a check) is left to the Python protocol, which counts and answers
 * it: commpress_take_data stops before it. The checks are those of
 * commpress.transport.datagrams.parse and Engine._on_data (in another order: C only ever
 * stops, and Python checks again in its own).
 *
 * Header, little-endian, 26 bytes: magic u8 | version << 4 | kind u8 | sender u16 |
 * root u16 | channel u16 | operation u32 | chunk u32 | count u32 | length u16 |
 * CRC-32 (zlib's) of the 22 bytes before it and of the payload, u32.
 */
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 26
#define CRC_AT 22
#define MAGIC 0xC7
#define VERSION 1
#define KIND_DATA 1

typedef unsigned long (*crc32_fn)(unsigned long crc, const unsigned char *data, unsigned int length);

/* What stays the same for one operation; built once per operation on the Python side. */
typedef struct {
    int64_t channel, operation, rank, world_size, chunk_bytes;
    uint8_t *const *buffers;      /* per root: where its payload goes (NULL: empty, or own) */
    const int64_t *buffer_bytes;  /* per root: its payload's length */
    const int64_t *counts;        /* per root: its chunk count */
    uint8_t *const *bitmaps;      /* per root: one byte per chunk, 1 once received */
    int64_t *missing;             /* per root: chunks still missing (shared with Python) */
    crc32_fn crc32;
} take_state;

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Takes whole datagrams of ``segment`` bytes (the last of the batch may be shorter) from the
 * start of ``batch`` while each is a new DATA chunk of the running operation that passes every
 * check; stops after one that completes its root (Python then acknowledges it). Returns how
 * many it took; ``touched[root]`` is set for each root that received a chunk. */
int64_t commpress_take_data(const take_state *state, const uint8_t *batch, int64_t size,
                            int64_t segment, uint8_t *touched) {
    int64_t taken = 0;
    for (int64_t start = 0; start < size; start += segment, taken++) {
        const uint8_t *datagram = batch + start;
        int64_t length = size - start < segment ? size - start : segment;
        if (length < HEADER_BYTES || datagram[0] != MAGIC) return taken;
        if (datagram[1] >> 4 != VERSION || (datagram[1] & 0xF) != KIND_DATA) return taken;
        int64_t payload_bytes = le16(datagram + 20);
        if (length != HEADER_BYTES + payload_bytes) return taken;
        int64_t sender = le16(datagram + 2), root = le16(datagram + 4);
        if (le16(datagram + 6) != state->channel || sender == state->rank) return taken;
        if (sender >= state->world_size || root >= state->world_size) return taken;
        if (sender != root) return taken;  /* DATA comes from its root only */
        if (le32(datagram + 8) != state->operation) return taken;
        const uint8_t *payload = datagram + HEADER_BYTES;
        unsigned long crc = state->crc32(0, datagram, CRC_AT);
        if (state->crc32(crc, payload, (unsigned int)payload_bytes) != le32(datagram + CRC_AT))
            return taken;
        uint8_t *buffer = state->buffers[root];
        int64_t chunk = le32(datagram + 12), count = le32(datagram + 16);
        if (root == state->rank || count != state->counts[root] || chunk >= count) return taken;
        if (state->bitmaps[root][chunk]) return taken;  /* a duplicate: Python counts it */
        int64_t offset = chunk * state->chunk_bytes;
        int64_t expected = state->buffer_bytes[root] - offset;
        if (expected > state->chunk_bytes) expected = state->chunk_bytes;
        if (payload_bytes != expected) return taken;
        if (payload_bytes) memcpy(buffer + offset, payload, (size_t)payload_bytes);
        state->bitmaps[root][chunk] = 1;
        touched[root] = 1;
        if (--state->missing[root] == 0) return taken + 1;
    }
    return taken;
}
