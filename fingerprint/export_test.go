package fingerprint

// FoldKeyForTest exposes foldKey to the external tests.
var FoldKeyForTest = foldKey
