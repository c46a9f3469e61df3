// One linter, run by `npm test`: ESLint with typescript-eslint's recommended rules.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', '.ordo/', '.scratch/', 'node_modules/', 'coverage/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  // Plain JavaScript files (bin/) run on Node.
  { files: ['**/*.js'], languageOptions: { globals: { process: 'readonly', console: 'readonly' } } },
  {
    rules: {
      // Rows from the driver are untyped by nature; they are mapped at one place each.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  // Surfaces use only what an application can: the public API in src/index.ts. Whatever they
  // need is exported there, so the package's users can build the same surfaces.
  surfaceImports('src/server/*.ts', 'index\\.js'),
  // The CLI starts the server surface through its entry, app.ts, which re-exports what it needs.
  surfaceImports('src/cli/*.ts', 'index\\.js|server/app\\.js'),
);

function surfaceImports(files, allowed) {
  const message =
    'a surface imports only the public API (../index.js); export what it needs from src/index.ts';
  return {
    files: [files],
    rules: {
      'no-restricted-imports': ['error', { patterns: [{ regex: `^\\.\\./(?!(${allowed})$)`, message }] }],
    },
  };
}
