package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// EnvDelegateTriggers, set to true or false, overrides
// Options.EngineFiresAll (true: delegated firing on).
const EnvDelegateTriggers = "ZIPTRAIL_DELEGATE_TRIGGERS"

func delegateFromEnv(opts *Options) error {
	v := os.Getenv(EnvDelegateTriggers)
	if v == "" {
		return nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("localcluster: %s=%q: want true or false", EnvDelegateTriggers, v)
	}
	opts.EngineFiresAll = !on
	return nil
}

// DelegateTriggers reports whether the running operator delegates firing
// (not Options.EngineFiresAll, or the last SetDelegateTriggers).
func (c *Cluster) DelegateTriggers() bool { return !c.opts.EngineFiresAll }

// SetDelegateTriggers switches the operator's delegated firing on a running
// cluster, as changing the chart's engine.delegateTriggers rolls the
// operator's Deployment: the operator restarts with the option (the engine
// keeps its sessions through the checkpoint, see RestartOperator; switch
// between sessions, not under them) and the call returns once as many
// sidecars of namespace as were connected before have connected to the new
// one. A sidecar's new stream replaces the triggers it fires (none with
// delegation off), so once they are back every firing follows the new
// setting. Nothing is done when the setting does not change.
func (c *Cluster) SetDelegateTriggers(ctx context.Context, on bool, namespace string) error {
	if c.opts.NoOperator {
		return errors.New("localcluster: no operator runs in this process (Options.NoOperator): set the chart's engine.delegateTriggers instead")
	}
	if c.DelegateTriggers() == on {
		return nil
	}
	before := len(c.op().srv.Sidecars(namespace))
	c.opts.EngineFiresAll = !on
	if err := c.RestartOperator(ctx); err != nil {
		return err
	}
	return waitFor(ctx, fmt.Sprintf("%d sidecars of namespace %s to reconnect to the operator", before, namespace), func() bool {
		op := c.op()
		return op != nil && len(op.srv.Sidecars(namespace)) >= before
	})
}
