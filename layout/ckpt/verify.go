package ckpt

// Verifier is a Source that can check the bytes it serves against a checksum
// its format stores (a torch.save record's CRC32). Verify reads everything the
// check covers, in bounded memory, and returns an error naming the file, the
// tensor and the cause when the bytes do not match. Sources whose format
// stores no checksum (raw safetensors) do not implement it.
//
// Reads check such checksums by themselves only when they happen to read a
// whole record; a --verify mode calls Verify on every chunk (VerifyChunks).
type Verifier interface {
	Source
	Verify() error
}

// VerifyChunks verifies every chunk of c whose source is a Verifier, in
// checkpoint order, stopping at the first mismatch. It returns how many
// chunks were verified and how many have no checksum to check.
func VerifyChunks(c *Checkpoint) (verified, unverifiable int, err error) {
	for _, t := range c.Tensors {
		for _, ch := range t.Chunks.All() {
			v, ok := ch.Source.(Verifier)
			if !ok {
				unverifiable++
				continue
			}
			if err := v.Verify(); err != nil {
				return verified, unverifiable, err
			}
			verified++
		}
	}
	return verified, unverifiable, nil
}
