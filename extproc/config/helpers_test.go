package config

// testEnv is the environment the test configs refer to. The key is a test
// value, not a secret.
var testEnv = map[string]string{
	"IDEMGATE_TEST_KEY_K1": "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=",
}

func testOptions() Options {
	return Options{LookupEnv: func(k string) (string, bool) {
		v, ok := testEnv[k]
		return v, ok
	}}
}
