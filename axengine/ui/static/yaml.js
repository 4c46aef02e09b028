// A JSON value as block-style YAML, for people to read a stored DAG as they wrote it.
// Pure. Strings that YAML would read as something else are double-quoted (JSON string
// syntax is valid YAML); multi-line strings use literal blocks.

const PLAIN = /^[A-Za-z0-9_./][A-Za-z0-9_ ./@()-]*$/;
const SPECIAL = /^(?:true|false|yes|no|on|off|null|~|y|n)$/i;
const NUMBER = /^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$|^0x|^0o/;

function scalar(value) {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  const s = String(value);
  if (s && PLAIN.test(s) && !SPECIAL.test(s) && !NUMBER.test(s) && !s.endsWith(' ')) return s;
  return JSON.stringify(s);
}

function key(k) {
  return PLAIN.test(k) && !SPECIAL.test(k) && !NUMBER.test(k) ? k : JSON.stringify(k);
}

function block(s, indent) {
  const pad = ' '.repeat(indent);
  const chomp = s.endsWith('\n') ? '' : '-';
  const body = s.endsWith('\n') ? s.slice(0, -1) : s;
  return `|${chomp}\n${body.split('\n').map((line) => (line ? pad + line : '')).join('\n')}`;
}

function emit(value, indent) {
  const pad = ' '.repeat(indent);
  if (Array.isArray(value)) {
    if (!value.length) return ' []';
    return value.map((item) => {
      const inner = emit(item, indent + 2);
      if (item && typeof item === 'object' && !Array.isArray(item) && Object.keys(item).length) {
        return `\n${pad}- ${inner.trimStart()}`;
      }
      return `\n${pad}-${inner}`;
    }).join('');
  }
  if (value && typeof value === 'object') {
    const entries = Object.entries(value);
    if (!entries.length) return ' {}';
    return entries.map(([k, v]) => `\n${pad}${key(k)}:${emit(v, indent + 2)}`).join('');
  }
  if (typeof value === 'string' && value.includes('\n') && !/^\s/.test(value)) {
    return ` ${block(value, indent)}`;
  }
  return ` ${scalar(value)}`;
}

/** `value` (a JSON value) as a YAML document. */
export function toYaml(value) {
  return `${emit(value, 0).replace(/^\n/, '').replace(/^ /, '')}\n`;
}
