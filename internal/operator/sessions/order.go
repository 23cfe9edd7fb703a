package sessions

import (
	"cmp"
	"slices"
)

// SortNewestFirst orders a listing of sessions as every listing of the
// gateway answers it (one registry, the sharded engine's registries of a
// replica, the replicas of a namespace together): newest first, by start
// time, then by id, so that listings of the same sessions agree whatever
// the registries they came from. `ziptrail sessions` shows them so.
func SortNewestFirst(list []Session) {
	slices.SortFunc(list, func(a, b Session) int {
		if c := b.Started.Compare(a.Started); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
}
