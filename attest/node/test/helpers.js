'use strict';
const fs = require('fs');
const path = require('path');

const repo = path.resolve(__dirname, '..', '..', '..');
const load = (...parts) => JSON.parse(fs.readFileSync(path.join(repo, ...parts), 'utf8'));

module.exports = {
  vectors: () => load('fingerprint', 'testdata', 'vectors.json'),
  fixtures: () => load('attest', 'testdata', 'attestations.json'),
  quiet: { warn() {} },
};
