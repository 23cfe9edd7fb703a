package localcluster

import "testing"

func TestDelegateFromEnv(t *testing.T) {
	for _, c := range []struct {
		env      string
		set, out bool
		err      bool
	}{{"", true, true, false}, {"", false, false, false}, {"true", false, true, false}, {"0", true, false, false}, {"yes", false, false, true}} {
		t.Setenv(EnvDelegateTriggers, c.env)
		o := Options{EngineFiresAll: !c.set}
		err := delegateFromEnv(&o)
		if (err != nil) != c.err || err == nil && o.EngineFiresAll == c.out {
			t.Errorf("%s=%q over %v: delegating %v, %v", EnvDelegateTriggers, c.env, c.set, !o.EngineFiresAll, err)
		}
	}
}
