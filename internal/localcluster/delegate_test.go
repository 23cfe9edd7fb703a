package localcluster

import "testing"

func TestDelegateFromEnv(t *testing.T) {
	for _, c := range []struct {
		env      string
		set, out bool
		err      bool
	}{{"", true, true, false}, {"", false, false, false}, {"true", false, true, false}, {"0", true, false, false}, {"yes", false, false, true}} {
		t.Setenv(EnvDelegateTriggers, c.env)
		o := Options{DelegateTriggers: c.set}
		err := delegateFromEnv(&o)
		if (err != nil) != c.err || err == nil && o.DelegateTriggers != c.out {
			t.Errorf("%s=%q over %v: %v, %v", EnvDelegateTriggers, c.env, c.set, o.DelegateTriggers, err)
		}
	}
}
