// dali_mesh: stores whose reads Python answers (callback_store.cc): a Python byte store that can read
// ranges of its keys (an Icechunk snapshot through the icechunk library, which names no chunk's object
// or byte range for this reader to read itself) binds two C functions to its spec, and the native
// reader reads it as any store, in parts where the codec allows. Host only, DALI-free.
//
// Threads: the reader calls the functions from its own threads (DALI's, the kept threads); Python's
// ctypes callbacks take the GIL, so every Python caller of the reader must have released it (ctypes
// calls of a CDLL do; DALI waits for outputs without it). At exit Python first cancels every call of
// the library in flight (a callback waiting on one fails at once, "the process is exiting"), then
// unbinds every store (UnbindCallbackStores, from an atexit hook): later reads fail at once, naming the
// store, and never enter an interpreter being torn down.
#ifndef DALI_MESH_STORAGE_CALLBACK_STORE_H_
#define DALI_MESH_STORAGE_CALLBACK_STORE_H_

#include <cstdint>
#include <string>

namespace dali_mesh {

// The version of `key`: 1 with its size and tag (the text and a NUL in tag[0..tag_cap)), 0 when the
// key does not exist, -1 with a message in err[0..err_cap).
using CallbackHead = int64_t (*)(const char *key, int64_t *size, char *tag, int64_t tag_cap, char *err,
                                 int64_t err_cap);
// Reads `n` ranges of `key` at once (one request of the Python store: its requests in flight
// together): sizes[i] bytes at offsets[i] into dsts[i], got[i] the bytes read (fewer only at the end of
// the object). 0, or -1 with a message in err[0..err_cap) (a missing key is an error: the plan found it).
using CallbackRead = int64_t (*)(const char *key, int64_t n, const int64_t *offsets, const int64_t *sizes,
                                 char *const *dsts, int64_t *got, char *err, int64_t err_cap);

// Binds the store `spec` (of a kind whose reads Python answers: "icechunk") to `head` and `read`, its
// objects named in messages `name` + "/" + key; both null: unbinds it (its reads then fail naming it).
// Fails naming the spec when this build has no such store or it is not answered by callbacks.
void BindCallbackStore(const std::string &spec, const std::string &name, CallbackHead head, CallbackRead read);

// Unbinds every callback store of this library and waits at most `wait_s` for the calls in flight to
// return (each needs the GIL: call it with the GIL released). Returns the calls still in flight.
int64_t UnbindCallbackStores(double wait_s);

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_CALLBACK_STORE_H_
