package megatron

import "encoding/json"

// parseConfig decodes the bytes of metadata.json; fields other than those of
// Config are ignored.
func parseConfig(data []byte) (Config, error) {
	var c Config
	err := json.Unmarshal(data, &c)
	return c, err
}
