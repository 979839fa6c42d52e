package consulkv

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// StampKey is the admission-stamp key every broker shares, under
// <prefix>admission-key: read, or created once by whichever broker is first.
func StampKey(ctx context.Context, kv *consul.KV, prefix string) ([]byte, error) {
	key := prefix + "admission-key"
	for i := 0; i < 30; i++ {
		pair, _, err := kv.Get(key, (&consul.QueryOptions{}).WithContext(ctx))
		if err == nil && pair != nil {
			return pair.Value, nil
		}
		if err == nil {
			secret := make([]byte, 32)
			rand.Read(secret)
			if ok, _, err := kv.CAS(&consul.KVPair{Key: key, Value: secret}, (&consul.WriteOptions{}).WithContext(ctx)); err == nil && ok {
				return secret, nil
			}
			continue // another broker created it first
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		select { // Consul not up yet
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil, errors.New("cannot read or create the admission key in Consul KV")
}
