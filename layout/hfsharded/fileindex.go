package hfsharded

import "encoding/json"

// parseFileIndex decodes NeMo's fqn_to_file_index_mapping.json: tensor name
// → 1-based index of the model file it belongs in.
func parseFileIndex(data []byte) (map[string]int, error) {
	var m map[string]int
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return m, nil
}
